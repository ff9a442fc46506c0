"""Request bodies, read the same way on every HTTP route.

A JSON body must say so (``Content-Type: application/json`` or a ``+json``
type; a request without a content type is read as JSON, as ``curl`` and
simple scripts send it); it is read up to a cap, then decoded by the one
client-JSON decoder of every protocol (``protocol.common.load_json``: depth
limit, no ``NaN``) and validated by a pydantic model. Every refusal is an
:class:`HttpRefusal`, which the gateway answers as ``{error, code, detail}``
with its status (``http_errors.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.types import Message

from omnilive.gateway.http_errors import HttpRefusal, status_for
from omnilive.protocol.common import (
    ErrorCode,
    ProtocolError,
    describe_validation_error,
    load_json,
)

M = TypeVar("M", bound=BaseModel)

SMALL_BODY_BYTES = 64 * 1024
"""The cap of a route whose body is a few settings (a comment, an app switch)."""


def is_json_type(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media in ("", "application/json") or (
        media.startswith("application/") and media.endswith("+json")
    )


def require_json_type(request: Request) -> None:
    """415 unless the body is declared as JSON (or not declared at all)."""
    content_type = request.headers.get("content-type", "")
    if not is_json_type(content_type):
        raise HttpRefusal(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"the body must be JSON (Content-Type: application/json), not {content_type}",
        )


def too_large(limit: int) -> HttpRefusal:
    return HttpRefusal(413, ErrorCode.PAYLOAD_TOO_LARGE, f"the body exceeds {limit} bytes")


async def read_capped(request: Request, limit: int) -> bytes:
    """The whole body, or a 413 :class:`HttpRefusal` as soon as it passes
    ``limit`` (declared or streamed): a large body is never held whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def with_body(request: Request, body: bytes) -> Request:
    """The same request with its body, already read (capped), for a parser
    that reads it again (Starlette's form parser)."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(request.scope, receive)


def refusal_of(exc: ProtocolError) -> HttpRefusal:
    return HttpRefusal(status_for(exc.code), exc.code, exc.message)


async def read_json(request: Request, limit: int, empty: Any = None) -> Any:
    """The decoded JSON body (``empty`` for an empty one, when given)."""
    require_json_type(request)
    body = await read_capped(request, limit)
    if empty is not None and not body.strip():
        return empty
    try:
        return load_json(body)
    except ProtocolError as exc:
        raise refusal_of(exc) from None


def validated(model: type[M], value: Any) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise HttpRefusal(422, ErrorCode.INVALID_REQUEST, describe_validation_error(exc)) from None


def json_body(model: type[M], limit: int = SMALL_BODY_BYTES) -> Any:
    """A route parameter: the body as ``model``, read by the rules above
    (``body: Annotated[Model, json_body(Model)]``)."""

    async def parse(request: Request) -> M:
        return validated(model, await read_json(request, limit))

    reader: Callable[[Request], Awaitable[M]] = parse
    return Depends(reader)
