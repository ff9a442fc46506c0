"""``POST /v1/client_secrets``: an API key in, a short-lived client token out.

Browsers cannot set headers on a WebSocket, and a page should not put its
API key in a URL; it mints a token here (with the key in ``Authorization``)
right before opening a session, and sends the token with the upgrade.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from omnilive.gateway.auth import Gatekeeper, principal_of
from omnilive.gateway.http_body import read_json, validated

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
    wanted = validated(SecretRequest, await read_json(request, MAX_BODY_BYTES, empty={}))
    ttl_s = min(wanted.ttl_s or settings.token_ttl_s, settings.max_token_ttl_s)
    token, expires_at = gatekeeper.tokens.mint(principal_of(request), ttl_s)
    return JSONResponse({"token": token, "expires_at": expires_at, "ttl_s": ttl_s})
