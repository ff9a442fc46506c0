"""``POST /v1/client_secrets``: an API key in, a short-lived client token out.

Browsers cannot set headers on a WebSocket, and a page should not put its
API key in a URL; it mints a token here (with the key in ``Authorization``)
right before opening a session, and sends the token with the upgrade.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omnilive.gateway.auth import Gatekeeper, principal_of
from omnilive.gateway.http_errors import error_response
from omnilive.protocol.common import describe_validation_error

router = APIRouter()
MAX_BODY_BYTES = 4096


class SecretRequest(BaseModel):
    """The optional body: how long the token should live."""

    model_config = ConfigDict(extra="forbid")
    ttl_s: float | None = Field(None, gt=0)


@router.post("/v1/client_secrets")
async def client_secret(request: Request) -> JSONResponse:
    gatekeeper: Gatekeeper = request.app.state.auth
    settings = gatekeeper.settings
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return error_response(413, f"body exceeds {MAX_BODY_BYTES} bytes", "payload_too_large")
    try:
        wanted = SecretRequest.model_validate(json.loads(body) if body.strip() else {})
    except (ValueError, ValidationError) as exc:
        message = describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
        return error_response(422, message, "invalid_request")
    ttl_s = min(wanted.ttl_s or settings.token_ttl_s, settings.max_token_ttl_s)
    token, expires_at = gatekeeper.tokens.mint(principal_of(request), ttl_s)
    return JSONResponse({"token": token, "expires_at": expires_at, "ttl_s": ttl_s})
