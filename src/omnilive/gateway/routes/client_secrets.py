"""``POST /v1/client_secrets``: an API key in, a short-lived client token out;
and ``POST /v1/realtime/client_secrets``, the same in the shape of OpenAI's
Realtime API (an ephemeral key for a browser: ``{value, expires_at, session}``).

Browsers cannot set headers on a WebSocket, and a page should not put its
API key in a URL; it mints a token here (with the key in ``Authorization``)
right before opening a session, and sends the token with the upgrade.
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omnilive.gateway.auth import Gatekeeper, principal_of
from omnilive.gateway.http_errors import error_response
from omnilive.ids import mint
from omnilive.protocol.common import describe_validation_error
from omnilive.protocol.openai_realtime import DEFAULT_MODEL, SessionConfig, session_object

router = APIRouter()
T = TypeVar("T", bound=BaseModel)
MAX_BODY_BYTES = 4096


class SecretRequest(BaseModel):
    """The optional body: how long the token should live."""

    model_config = ConfigDict(extra="forbid")
    ttl_s: float | None = Field(None, gt=0)


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(600, ge=10, le=7200)


class OpenAISecretRequest(BaseModel):
    """OpenAI's body: when the key expires, and the session it is for."""

    model_config = ConfigDict(extra="ignore")
    expires_after: ExpiresAfter | None = None
    session: SessionConfig = Field(default_factory=SessionConfig)


async def _body(request: Request, schema: type[T]) -> T | JSONResponse:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return error_response(413, f"body exceeds {MAX_BODY_BYTES} bytes", "payload_too_large")
    try:
        return schema.model_validate(json.loads(body) if body.strip() else {})
    except (ValueError, ValidationError) as exc:
        message = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
        return error_response(422, message, "invalid_request")


@router.post("/v1/client_secrets")
async def client_secret(request: Request) -> JSONResponse:
    gatekeeper: Gatekeeper = request.app.state.auth
    settings = gatekeeper.settings
    wanted = await _body(request, SecretRequest)
    if isinstance(wanted, JSONResponse):
        return wanted
    ttl_s = min(wanted.ttl_s or settings.token_ttl_s, settings.max_token_ttl_s)
    token, expires_at = gatekeeper.tokens.mint(principal_of(request), ttl_s)
    return JSONResponse({"token": token, "expires_at": expires_at, "ttl_s": ttl_s})


@router.post("/v1/realtime/client_secrets")
async def realtime_client_secret(request: Request) -> JSONResponse:
    """A client token (tied to the caller's key and its limits) as OpenAI's
    ephemeral key; the browser sends it as ``openai-insecure-api-key.<value>``
    or ``Authorization: Bearer``. The session is echoed: the client still
    sends its ``session.update``."""
    gatekeeper: Gatekeeper = request.app.state.auth
    settings = gatekeeper.settings
    wanted = await _body(request, OpenAISecretRequest)
    if isinstance(wanted, JSONResponse):
        return wanted
    asked = wanted.expires_after.seconds if wanted.expires_after else settings.token_ttl_s
    token, expires_at = gatekeeper.tokens.mint(
        principal_of(request), min(asked, settings.max_token_ttl_s)
    )
    session = session_object(mint("sess_", 12), wanted.session, DEFAULT_MODEL)
    return JSONResponse({"value": token, "expires_at": int(expires_at), "session": session})
