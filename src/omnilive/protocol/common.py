"""Messages and error codes shared by every mode."""

from __future__ import annotations

import binascii
import contextlib
import json
import re
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from omnilive.ids import is_safe_id

T = TypeVar("T")
Code = TypeVar("Code", bound=str)


class ErrorCode(StrEnum):
    """Documented error codes (docs/reference/errors.md)."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_TYPE = "unknown_type"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # HTTP: a body that is not JSON
    UNSUPPORTED = "unsupported_capability"
    QUEUE_FULL = "queue_full"
    NO_WORKERS = "service_unavailable"
    WORKER_FAILED = "worker_failed"
    INFERENCE_ERROR = "inference_error"
    TIMEOUT = "timeout"
    NOT_READY = "not_ready"
    CANCELLED = "cancelled"
    APP_DISABLED = "app_disabled"
    SERVER_SHUTDOWN = "server_shutdown"
    RESUME_REFUSED = "resume_refused"  # a bad, expired, used or foreign resume token
    # Refusals of the gateway's access control (HTTP answers, before any protocol):
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    RATE_LIMITED = "rate_limited"
    TOO_MANY_SESSIONS = "too_many_sessions"


class ProtocolError(Exception, Generic[Code]):
    """A client message refused with a documented code: the one refusal of
    every protocol, omnilive's own and each Realtime dialect's.

    ``code`` is the dialect's: :class:`ErrorCode` for omnilive's protocols,
    ``RealtimeErrorCode`` for the reference's Realtime dialect, the documented
    strings of OpenAI's Realtime and Live dialects, and for the reference's
    newer dialect, which has no error event, the reason its session ends
    (``protocol/realtime_v2.py``). ``param`` and ``event_id`` are where
    OpenAI's dialects name the parameter at fault and the client event that
    caused it. Each dialect has one presenter that turns it into that
    dialect's error event (``refusal_event`` in its protocol module)."""

    def __init__(
        self, code: Code, message: str, param: str | None = None, event_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id


def strict_base64(value: str) -> str:
    """The shape of base64 (ASCII, whole 4-character groups), checked without
    decoding: media is decoded exactly once, where it is used (on the worker,
    strictly: a bad character there is the same documented error)."""
    if not value.isascii() or len(value) % 4:
        raise ValueError("invalid base64 (not whole groups of 4 ASCII characters)")
    return value


Base64Str = Annotated[str, AfterValidator(strict_base64)]
"""A string that must be strict base64 (checked, not kept decoded)."""


def decoded_length(data: str) -> int:
    """Bytes a base64 string decodes to, without decoding it."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def check_float32(data: str, what: str = "audio") -> str:
    """Base64 of float32 PCM holds whole 4-byte samples."""
    if decoded_length(data) % 4:
        raise ValueError(f"{what} must be float32 PCM (a multiple of 4 bytes)")
    return data


Float32Base64 = Annotated[str, AfterValidator(strict_base64), AfterValidator(check_float32)]
"""Strict base64 of raw little-endian float32 PCM samples."""


def check_voice(data: str, what: str = "reference voice") -> str:
    """A reference voice is a WAV file (its bytes start with ``RIFF``) or raw
    float32 PCM at 16 kHz: clients of the reference send either."""
    with contextlib.suppress(binascii.Error, ValueError):
        if binascii.a2b_base64(data[:8]).startswith(b"RIFF"):
            return data
    return check_float32(data, what)


VoiceBase64 = Annotated[str, AfterValidator(strict_base64), AfterValidator(check_voice)]
"""Strict base64 of a reference voice: a WAV file, or raw float32 PCM (16 kHz)."""


def _check_safe_id(value: str) -> str:
    if not is_safe_id(value):
        raise ValueError("must be 1-128 of A-Z a-z 0-9 _ -")
    return value


SafeId = Annotated[str, AfterValidator(_check_safe_id)]
"""An id that names a stored object (e.g. a reference voice): one safe path component."""


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming the first offending field, without echoing payloads."""
    # For a union (``content: str | list``) pydantic reports every branch;
    # the deepest location is the one that names the real problem.
    errors = exc.errors(include_input=False, include_url=False)
    first = max(errors, key=lambda e: len(e["loc"]))
    where = ".".join(str(p) for p in first["loc"] if not str(p).startswith(("str", "list[")))
    return f"{where or 'message'}: {first['msg']}"


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def has_lone_surrogates(raw: str | bytes, value: Any) -> bool:
    """JSON may escape half of a UTF-16 pair (``"\\ud800"``); such a string
    cannot be encoded again (in replies, recordings, the worker's copy)."""
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    if not _SURROGATE_ESCAPE.search(text):  # cheap: media payloads hold no backslash
        return False
    try:
        for string in _strings(value):
            string.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


MAX_JSON_DEPTH = 64
"""How deeply a client message may nest arrays and objects. Real messages
nest a handful of levels (a tool's JSON schema a few more); deeper ones exist
only to exhaust a parser's recursion."""


def json_depth(value: Any) -> int:
    """How many arrays and objects are nested in ``value`` at its deepest
    (walked without recursion, so any depth can be measured)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return deepest


class _NotJsonConstant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJsonConstant(f"{name} is not a JSON value")


def load_json(raw: str | bytes, max_bytes: int | None = None) -> Any:
    """The one decoder of client JSON, in every protocol and both processes.

    Raises :class:`ProtocolError`: ``payload_too_large`` over ``max_bytes``,
    ``invalid_json`` for text that is not JSON (``NaN`` and ``Infinity``,
    which Python's decoder would take, unpaired UTF-16 surrogates, which
    could not be encoded again, and integers of more digits than Python
    converts, included) or nests deeper than
    :data:`MAX_JSON_DEPTH` (which would exhaust the recursion of whatever
    walks it next: validation, recording, re-encoding)."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise ProtocolError(
            ErrorCode.PAYLOAD_TOO_LARGE, f"message of {len(raw)} bytes exceeds {max_bytes}"
        )
    too_deep = f"message nests deeper than {MAX_JSON_DEPTH} levels"
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    # ValueError: besides JSONDecodeError, UnicodeDecodeError and a constant,
    # an integer longer than ``sys.get_int_max_str_digits()`` (4300 digits).
    except ValueError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"message is not JSON: {exc}") from None
    except RecursionError:  # deeper than the interpreter's own limit
        raise ProtocolError(ErrorCode.INVALID_JSON, too_deep) from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ProtocolError(ErrorCode.INVALID_JSON, too_deep)
    if has_lone_surrogates(raw, value):
        raise ProtocolError(ErrorCode.INVALID_JSON, "message holds an unpaired UTF-16 surrogate")
    return value


def json_object(value: Any) -> dict[str, Any]:
    """A decoded message that must be a JSON object, or :class:`ProtocolError`."""
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.INVALID_REQUEST, "message must be a JSON object")
    return value


def parse_json_object(raw: str | bytes, max_bytes: int | None) -> dict[str, Any]:
    """Decode one client frame into a JSON object or raise :class:`ProtocolError`."""
    return json_object(load_json(raw, max_bytes))


def decode_client_message(
    raw: str | bytes, adapter: TypeAdapter[Any], known_types: tuple[str, ...], max_bytes: int
) -> Any:
    """Parse and validate one client frame of a ``type``-tagged protocol."""
    data = parse_json_object(raw, max_bytes)
    kind = data.get("type")
    if kind not in known_types:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE,
            f"unknown message type {kind!r}; expected one of {', '.join(known_types)}",
        )
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, describe_validation_error(exc)) from None


def error_message(message: str, code: ErrorCode | str) -> dict[str, Any]:
    """The error message of the chat, half-duplex and duplex protocols."""
    return {"type": "error", "error": message, "code": str(code)}


def queued_message(
    position: int, estimated_wait_s: float, ticket_id: str, queue_length: int
) -> dict[str, Any]:
    return {
        "type": "queued",
        "position": position,
        "estimated_wait_s": round(estimated_wait_s, 1),
        "ticket_id": ticket_id,
        "queue_length": queue_length,
    }


def queue_update_message(position: int, estimated_wait_s: float, queue_length: int) -> dict:
    return {
        "type": "queue_update",
        "position": position,
        "estimated_wait_s": round(estimated_wait_s, 1),
        "queue_length": queue_length,
    }


QUEUE_DONE: dict[str, Any] = {"type": "queue_done"}


class ContextWindowOption(BaseModel):
    """omnilive's extension to a duplex session's configuration
    (``context_window``): how its context slides once it fills, where the
    engine slides it (its default in the prepared message's
    ``capabilities.context_window``). The fields given replace the engine's;
    ``"off"`` alone (or ``{"mode": "off"}``) keeps a fixed context, and the
    session ends ``context_full`` when it fills."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["off", "basic", "context"] | None = None
    high_tokens: int | None = Field(None, ge=64, le=32768)
    low_tokens: int | None = Field(None, ge=0, le=32768)
    previous_max_tokens: int | None = Field(None, ge=0, le=4096)
    max_units: int | None = Field(None, ge=1, le=4096)

    @model_validator(mode="before")
    @classmethod
    def _mode_alone(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value


def decode_event(raw: str | bytes, max_bytes: int, parse: Callable[[dict[str, Any]], T]) -> T:
    """A client frame of one of OpenAI's dialects through :func:`load_json`
    and the dialect's ``parse``; every refusal (not JSON, too large, not an
    object, not an event the dialect knows) raised as :class:`ProtocolError`."""
    data = load_json(raw, max_bytes)
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.INVALID_JSON, "an event is a JSON object")
    return parse(data)
