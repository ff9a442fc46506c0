"""Exceptions of the client, one per documented error code.

The server names every refusal with a code (docs/reference/errors.md, the Realtime
API's error codes, the access-control refusals). The client raises the class
registered for that code, so callers can catch exactly what they can handle::

    try:
        async with HalfDuplex(url) as session: ...
    except QueueFullError:
        ...  # try again later

Codes the client does not know (a newer server) raise :class:`OmniliveError`
itself, with the code kept in ``code``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

E = TypeVar("E", bound="OmniliveError")


class OmniliveError(Exception):
    """A session or request that the server ended or refused, or a protocol
    the client could not follow. ``code`` is the server's error code."""

    code: ClassVar[str] = "unknown"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]  # an unknown code, kept on the instance
        self.details = details  # e.g. status, close_code, retry_after_s

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


_BY_CODE: dict[str, type[OmniliveError]] = {}


def _code(code: str) -> Callable[[type[E]], type[E]]:
    def register(cls: type[E]) -> type[E]:
        cls.code = code
        _BY_CODE[code] = cls
        return cls

    return register


# --- the chat, half-duplex and duplex protocols (docs/reference/errors.md) -----------------------


@_code("invalid_json")
class InvalidJsonError(OmniliveError):
    """A frame the server could not read as JSON."""


@_code("invalid_request")
class InvalidRequestError(OmniliveError):
    """A field is missing or wrong (the message says which)."""


@_code("unknown_type")
class UnknownTypeError(OmniliveError):
    """A message ``type`` the protocol does not have."""


@_code("payload_too_large")
class PayloadTooLargeError(OmniliveError):
    """A message, chunk, frame or request over its limit."""


@_code("unsupported_media_type")
class UnsupportedMediaTypeError(OmniliveError):
    """An HTTP body declared as something other than what the route reads (JSON)."""


@_code("unsupported_capability")
class UnsupportedCapabilityError(OmniliveError):
    """The engine cannot take that input (e.g. images on a speech-only engine)."""


@_code("not_ready")
class NotReadyError(OmniliveError):
    """A message sent before its time (audio before the session is prepared)."""


@_code("queue_full")
class QueueFullError(OmniliveError):
    """The server's queue is full: try again later."""


@_code("service_unavailable")
class ServiceUnavailableError(OmniliveError):
    """No worker can serve: try again later."""


@_code("worker_failed")
class WorkerFailedError(OmniliveError):
    """The worker died or could not be reached during the session."""


@_code("inference_error")
class InferenceError(OmniliveError):
    """The model failed; in sessions only that turn or unit is lost."""


@_code("timeout")
class RequestTimeoutError(OmniliveError, builtins.TimeoutError):
    """The first message (the request, ``prepare``) did not come in time."""


@_code("cancelled")
class RequestCancelledError(OmniliveError):
    """An administrator withdrew the queued request."""


@_code("app_disabled")
class AppDisabledError(OmniliveError):
    """The mode's app is switched off on the server."""


@_code("server_shutdown")
class ServerShutdownError(OmniliveError):
    """The server is shutting down; reconnect shortly."""


# --- access control (an HTTP status instead of the WebSocket upgrade) ----------------


@_code("unauthorized")
class UnauthorizedError(OmniliveError):
    """No credential, or an unknown or expired API key or client token."""


@_code("forbidden")
class ForbiddenError(OmniliveError):
    """A route this credential may not use."""


@_code("origin_not_allowed")
class OriginNotAllowedError(OmniliveError):
    """A request from a web origin the server does not allow."""


@_code("rate_limited")
class RateLimitedError(OmniliveError):
    """Too many requests for this key; ``details['retry_after_s']`` says when to retry."""


@_code("too_many_sessions")
class TooManySessionsError(OmniliveError):
    """This key already holds as many sessions as it may."""


@_code("resume_refused")
class ResumeRefusedError(OmniliveError):
    """A resume token this server does not hold for this key and route (bad,
    expired, or the session has ended): the session cannot be continued."""


@_code("not_found")
class NotFoundError(OmniliveError):
    """No such route (or stored object)."""


# --- the Realtime API ---------------------------------------------------------------


@_code("unknown_event")
class UnknownEventError(OmniliveError):
    """A Realtime event type the server does not know."""


@_code("missing_field")
class MissingFieldError(OmniliveError):
    """A Realtime event without a required field."""


@_code("invalid_payload")
class InvalidPayloadError(OmniliveError):
    """A Realtime event with an invalid field value."""


@_code("worker_busy")
class WorkerBusyError(OmniliveError):
    """No idle worker was available."""


@_code("worker_connect_failed")
class WorkerConnectFailedError(OmniliveError):
    """The server could not reach its worker."""


@_code("backend_error")
class BackendError(OmniliveError):
    """The Realtime API's newer dialect ended the session as failed
    (``session.closed{reason: backend_error}``, the diagnostic as message)."""


@_code("error")
class SessionFailedError(OmniliveError):
    """The Realtime API's older dialect ended the session as failed
    (``session.closed{reason: error}``)."""


# --- the client's own ------------------------------------------------------------------


@_code("connection_failed")
class ConnectionFailedError(OmniliveError):
    """The server could not be reached, or refused the upgrade without a code."""


@_code("connection_lost")
class ConnectionLostError(OmniliveError):
    """The socket closed before the session ended the protocol's way."""


@_code("protocol_violation")
class ProtocolViolationError(OmniliveError):
    """The server sent something this client cannot follow (a bug on either side)."""


@_code("session_closed")
class SessionClosedError(OmniliveError):
    """An operation on a session that has already ended."""


def error_for(code: str, message: str, **details: Any) -> OmniliveError:
    """The exception registered for ``code`` (the base class for an unknown one)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return OmniliveError(message, code=code, **details)
    return cls(message, **details)


def known_codes() -> frozenset[str]:
    return frozenset(_BY_CODE)
