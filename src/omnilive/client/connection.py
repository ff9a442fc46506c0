"""Reaching a server: URLs, credentials, the WebSocket upgrade, client tokens.

A server is named by its base URL (``http://127.0.0.1:8006``, ``https://...``,
or the same with ``ws``/``wss``). Credentials are an API key, sent as
``Authorization: Bearer``, or a client token (``POST /v1/client_secrets``,
minted from a key with :func:`client_token`), sent as the subprotocol
``omnilive.token.<token>`` as browsers do. A refused upgrade (an HTTP status
with ``{error, code}``) becomes the exception of its code.
"""

from __future__ import annotations

import json
import ssl as ssl_module
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from omnilive.client.errors import ConnectionFailedError, OmniliveError, error_for

DEFAULT_URL = "http://127.0.0.1:8006"
TOKEN_SUBPROTOCOL = "omnilive.token."
MAX_MESSAGE_BYTES = 256 * 2**20  # a non-streamed chat answer carries all its audio
_STATUS_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 429: "rate_limited",
                 503: "service_unavailable"}  # fmt: skip


@dataclass(frozen=True)
class Credentials:
    """An API key or a client token (a token wins when both are given)."""

    key: str | None = None
    token: str | None = None

    def headers(self) -> dict[str, str]:
        if self.key and not self.token:
            return {"Authorization": f"Bearer {self.key}"}
        return {}

    def subprotocols(self) -> list[Subprotocol]:
        if self.token:
            return [Subprotocol("omnilive"), Subprotocol(f"{TOKEN_SUBPROTOCOL}{self.token}")]
        return []


def _split(base: str) -> tuple[str, str, str]:
    """(http scheme, host, path prefix) of a server's base URL."""
    parts = urlsplit(base if "://" in base else f"http://{base}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https"):
        raise ValueError(f"a server URL is http(s):// or ws(s)://, not {base!r}")
    return scheme, parts.netloc, parts.path.rstrip("/")


def http_url(base: str, path: str) -> str:
    scheme, host, prefix = _split(base)
    return urlunsplit((scheme, host, f"{prefix}{path}", "", ""))


def ws_url(base: str, path: str, **query: str) -> str:
    scheme, host, prefix = _split(base)
    ws_scheme = "wss" if scheme == "https" else "ws"
    return urlunsplit((ws_scheme, host, f"{prefix}{path}", urlencode(query), ""))


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query string."""
    scheme, netloc, path, query, fragment = urlsplit(url)
    extra = urlencode(params)
    return urlunsplit((scheme, netloc, path, f"{query}&{extra}" if query else extra, fragment))


def refusal(
    status: int, body: bytes | bytearray | str, retry_after: str | None = None
) -> OmniliveError:
    """The exception for an HTTP refusal ``{error, code}`` (or a bare status)."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    code = data.get("code") or _STATUS_CODES.get(status, "connection_failed")
    message = str(data.get("error") or data.get("detail") or f"HTTP {status}")
    details: dict[str, Any] = {"status": status}
    if retry_after and retry_after.isdigit():
        details["retry_after_s"] = int(retry_after)
    return error_for(str(code), message, **details)


async def open_socket(
    url: str,
    credentials: Credentials,
    ssl: ssl_module.SSLContext | None = None,
    open_timeout: float = 30.0,
) -> ClientConnection:
    """The WebSocket to ``url``; raises the exception of a refusal's code, or
    :class:`ConnectionFailedError` when the server cannot be reached."""
    options: dict[str, Any] = {"ssl": ssl} if ssl is not None and url.startswith("wss") else {}
    try:
        return await connect(
            url,
            additional_headers=credentials.headers(),
            subprotocols=credentials.subprotocols() or None,
            max_size=MAX_MESSAGE_BYTES,
            open_timeout=open_timeout,
            **options,
        )
    except InvalidStatus as exc:
        response = exc.response
        retry = response.headers.get("Retry-After")
        raise refusal(response.status_code, response.body or b"", retry) from None
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        raise ConnectionFailedError(f"cannot reach {url.split('?')[0]}: {exc}") from None


@dataclass(frozen=True)
class ClientToken:
    token: str
    expires_at: float
    ttl_s: float


async def client_token(
    base_url: str, key: str, ttl_s: float | None = None, ssl: ssl_module.SSLContext | None = None
) -> ClientToken:
    """A short-lived client token minted from an API key (``POST /v1/client_secrets``):
    what to hand a browser or another process instead of the key itself."""
    body = {"ttl_s": ttl_s} if ttl_s is not None else {}
    verify: ssl_module.SSLContext | bool = ssl if ssl is not None else True
    try:
        async with httpx.AsyncClient(verify=verify, timeout=30) as http:
            response = await http.post(
                http_url(base_url, "/v1/client_secrets"),
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            )
    except httpx.HTTPError as exc:
        raise ConnectionFailedError(f"cannot reach {base_url}: {exc}") from None
    if response.status_code != 200:
        raise refusal(response.status_code, response.content, response.headers.get("Retry-After"))
    data = response.json()
    return ClientToken(data["token"], float(data["expires_at"]), float(data["ttl_s"]))
