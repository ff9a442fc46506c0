"""``POST /v1/client_secrets``: an API key in, a short-lived client token out;
and ``POST /v1/realtime/client_secrets``, the same in the shape of OpenAI's
Realtime API (an ephemeral key for a browser: ``{value, expires_at, session}``).

Browsers cannot set headers on a WebSocket, and a page should not put its
API key in a URL; it mints a token here (with the key in ``Authorization``)
right before opening a session, and sends the token with the upgrade.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from omnilive.gateway.auth import Gatekeeper, principal_of
from omnilive.gateway.credentials import EPHEMERAL_PREFIX
from omnilive.gateway.http_body import read_json, validated
from omnilive.ids import mint
from omnilive.protocol.openai_realtime import DEFAULT_MODEL, SessionConfig, session_object

router = APIRouter()
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


@router.post("/v1/client_secrets")
async def client_secret(request: Request) -> JSONResponse:
    gatekeeper: Gatekeeper = request.app.state.auth
    settings = gatekeeper.settings
    wanted = validated(SecretRequest, await read_json(request, MAX_BODY_BYTES, empty={}))
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
    wanted = validated(OpenAISecretRequest, await read_json(request, MAX_BODY_BYTES, empty={}))
    asked = wanted.expires_after.seconds if wanted.expires_after else settings.token_ttl_s
    token, expires_at = gatekeeper.tokens.mint(
        principal_of(request), min(asked, settings.max_token_ttl_s)
    )
    session = session_object(mint("sess_", 12), wanted.session, DEFAULT_MODEL)
    value = EPHEMERAL_PREFIX + token  # what OpenAI's browser SDKs require of a client key
    return JSONResponse({"value": value, "expires_at": int(expires_at), "session": session})
