"""One shape and one set of statuses for every HTTP error omnilive answers with.

``{"error": message, "code": code, "detail": message}``: ``code`` is a stable
name to branch on, ``error`` the message for people, and ``detail`` the same
message under the name FastAPI (and so the reference's pages and scripts)
reads. A route refuses by raising :class:`HttpRefusal` (or letting a
``ProtocolError`` of the shared decoders through); FastAPI's own refusals
(a bad path or query parameter, an unknown method) are given the same shape
by the handlers :func:`install_error_handlers` puts on the app.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from omnilive.protocol.common import ErrorCode, ProtocolError

log = logging.getLogger(__name__)

# The HTTP status of each documented error code (docs/reference/errors.md).
_STATUS = {
    ErrorCode.INVALID_JSON: 422,
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.UNKNOWN_TYPE: 422,
    ErrorCode.UNSUPPORTED: 422,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.QUEUE_FULL: 503,
    ErrorCode.NO_WORKERS: 503,
    ErrorCode.SERVER_SHUTDOWN: 503,
    ErrorCode.WORKER_FAILED: 502,
    ErrorCode.INFERENCE_ERROR: 502,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.NOT_READY: 409,
    ErrorCode.CANCELLED: 409,
    ErrorCode.APP_DISABLED: 403,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.ORIGIN_NOT_ALLOWED: 403,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.TOO_MANY_SESSIONS: 429,
}

# The code of a status FastAPI or Starlette answers by itself.
_CODE_OF_STATUS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: str(ErrorCode.PAYLOAD_TOO_LARGE),
    415: str(ErrorCode.UNSUPPORTED_MEDIA_TYPE),
    422: str(ErrorCode.INVALID_REQUEST),
}


def status_for(code: ErrorCode | str) -> int:
    """The HTTP status that answers an error ``code``."""
    try:
        return _STATUS[ErrorCode(code)]
    except (ValueError, KeyError):
        return 422 if code in ("undecodable_audio", "audio_too_long", "audio_too_short") else 500


class HttpRefusal(Exception):
    """A request refused with a documented status and code."""

    def __init__(self, status: int, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = str(code)
        self.message = message


def error_body(message: str, code: str) -> dict[str, str]:
    return {"error": message, "code": code, "detail": message}


def error_response(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, code), status_code=status)


def _describe(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    return f"{where or 'request'}: {first.get('msg', 'invalid')}"


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal of every HTTP route in the documented shape."""

    async def refusal(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HttpRefusal)
        return error_response(exc.status, exc.message, exc.code)

    async def protocol_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProtocolError)
        return error_response(status_for(exc.code), exc.message, str(exc.code))

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, _describe(exc), str(ErrorCode.INVALID_REQUEST))

    async def http_exception(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        code = _CODE_OF_STATUS.get(exc.status_code, "error")
        return JSONResponse(
            error_body(message, code), status_code=exc.status_code, headers=exc.headers
        )

    async def client_gone(request: Request, _: Exception) -> Response:
        # The client left before its body was whole: nobody reads an answer,
        # and it is no failure of the server's.
        log.info("%s %s: the client left mid-body", request.method, request.url.path)
        return Response(status_code=400)

    app.add_exception_handler(HttpRefusal, refusal)
    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(ProtocolError, protocol_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_exception)
