"""Authentication, origin checks and per-key limits for every request, in one
ASGI middleware that runs before routing.

The decision (:class:`Gatekeeper`) is plain code over the request's method,
path and headers; the middleware only carries it out. A WebSocket upgrade
that is refused is answered with an HTTP status before it is accepted
(a denial response where the server supports one, else a 403).

Credentials: ``Authorization: Bearer <API key>`` everywhere; where a client
token is enough (opening a session, reading a recording) also
``Authorization: Bearer <token>``, ``?token=<token>`` or, for browsers,
the WebSocket subprotocol ``omnilive.token.<token>`` next to ``omnilive``.
Realtime API browser clients offer their key as ``map-api-key.<key>`` next to
``map.realtime``; that counts as the ``Authorization`` header. The session
of a WebRTC call run by a media process comes with a one-time pass for its
caller instead (``call_passes.py``): its signalling request was checked.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnilive.config import AuthSettings, LimitSettings
from omnilive.gateway.access import WS, Access, AccessTable, Rule
from omnilive.gateway.call_passes import PASS_HEADER, CallPasses
from omnilive.gateway.credentials import (
    ANONYMOUS,
    ClientTokens,
    CredentialError,
    KeyRing,
    Principal,
)
from omnilive.gateway.http_errors import error_body
from omnilive.gateway.limits import KeyLimiter, Refusal
from omnilive.gateway.resume import RESUME_SUBPROTOCOLS, TOKEN_PARAM, asks_resume
from omnilive.protocol.common import ErrorCode

if TYPE_CHECKING:
    from omnilive.gateway.client_ws import ClientSocket

log = logging.getLogger(__name__)

PRINCIPAL_KEY = "omnilive.principal"
SUBPROTOCOL = "omnilive"
TOKEN_SUBPROTOCOL = "omnilive.token."
# The Realtime API's subprotocol, and its browser clients' way to send a key.
REALTIME_SUBPROTOCOL = "map.realtime"
KEY_SUBPROTOCOL = "map-api-key."
# OpenAI's Realtime API (GA) from a browser: ``realtime`` plus the key (or an
# ephemeral client secret) as ``openai-insecure-api-key.<key>``.
OPENAI_SUBPROTOCOL = "realtime"
OPENAI_KEY_SUBPROTOCOL = "openai-insecure-api-key."
CREDENTIAL_SUBPROTOCOLS = (TOKEN_SUBPROTOCOL, KEY_SUBPROTOCOL, OPENAI_KEY_SUBPROTOCOL)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
_DENIED_UPGRADE: ContextVar[bool] = ContextVar("omnilive_denied_upgrade", default=False)


@dataclass
class Denied(Exception):
    """A refusal: HTTP status, documented code, message, extra headers."""

    status: int
    code: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        return json.dumps(error_body(self.message, self.code)).encode()


@dataclass(frozen=True)
class AccessRequest:
    """What the gatekeeper looks at."""

    method: str  # "WS" for a WebSocket upgrade
    path: str
    headers: Headers
    query: dict[str, str]
    subprotocols: tuple[str, ...] = ()
    secure: bool = False  # it came over TLS (https, wss)


def is_loopback_host(host: str) -> bool:
    """A Host header (``name[:port]``) that names this machine's loopback."""
    name = urlsplit(f"//{host}").hostname or ""
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def origin_allowed(origin: str, host: str, allowed: list[str], secure: bool = False) -> bool:
    """Same origin or listed. Same origin: a web page's scheme (``https``;
    also ``http`` unless the request came over TLS, since a TLS proxy in front
    of the gateway sees its pages' ``https`` origins over plain HTTP) and
    the Host header's host:port."""
    if "*" in allowed or origin.rstrip("/") in allowed:
        return True
    parts = urlsplit(origin)
    schemes = ("https",) if secure else ("http", "https")
    return (
        parts.scheme.lower() in schemes
        and bool(parts.netloc)
        and parts.netloc.lower() == host.lower()
    )


class Gatekeeper:
    """Decides every request: who it is, and whether they may do it now."""

    def __init__(
        self,
        table: AccessTable,
        keys: KeyRing,
        tokens: ClientTokens,
        limiter: KeyLimiter,
        settings: AuthSettings,
    ) -> None:
        self.table = table
        self.keys = keys
        self.tokens = tokens
        self.limiter = limiter
        self.settings = settings
        self.passes = CallPasses()

    @classmethod
    def from_settings(
        cls, auth: AuthSettings, limits: LimitSettings, public_pages: list[str]
    ) -> Gatekeeper:
        keys = KeyRing.from_settings(auth)
        limiter = KeyLimiter(limits.requests_per_minute_per_key, limits.max_sessions_per_key)
        return cls(AccessTable(public_pages), keys, ClientTokens.from_settings(auth, keys),
                   limiter, auth)  # fmt: skip

    @property
    def open(self) -> bool:
        return self.keys.open

    def decide(self, request: AccessRequest) -> tuple[Rule, Principal | None]:
        """The request's rule and principal (None for public routes), or :class:`Denied`."""
        rule = self.table.classify(request.method, request.path)
        if rule is None:
            raise Denied(404, "not_found", "no such route")
        if rule.access is Access.PUBLIC:
            return rule, None
        secret = request.headers.get(PASS_HEADER)
        if secret is not None and request.method == WS:
            return rule, self._call_pass(request, rule, secret)
        self._check_origin(request)
        if self.open:
            self._check_open_host(request)
            return rule, ANONYMOUS
        principal = self._authenticate(request, rule)
        if rule.access is Access.ADMIN and not principal.is_admin:
            raise Denied(403, ErrorCode.FORBIDDEN, "this route needs an admin key")
        refusal = self.limiter.request(principal)
        if refusal is not None:
            raise _too_many(refusal)
        return rule, principal

    def _call_pass(self, request: AccessRequest, rule: Rule, secret: str) -> Principal:
        """A call's session from a media process: the caller its signalling
        request was (whose origin and host were checked there), counted against
        the rate limit as that session is when the gateway runs the call."""
        principal = self.passes.redeem(secret, request.path)
        if principal is None or not rule.opens_session:
            raise _unauthorized("the call's pass is unknown, used, lapsed or for another route")
        if not self.open:
            refusal = self.limiter.request(principal)
            if refusal is not None:
                raise _too_many(refusal)
        return principal

    def _check_origin(self, request: AccessRequest) -> None:
        origin = request.headers.get("origin")
        if origin is None or request.method in SAFE_METHODS:
            return  # not a browser, or a request that changes nothing (an upgrade is "WS")
        host = request.headers.get("host", "")
        if not origin_allowed(origin, host, self.settings.allowed_origins, request.secure):
            raise Denied(403, ErrorCode.ORIGIN_NOT_ALLOWED, f"origin {origin} is not allowed")

    def _check_open_host(self, request: AccessRequest) -> None:
        # An open gateway trusts whoever reaches it, so it must only be
        # reachable as loopback: a page of another site whose name resolves
        # to 127.0.0.1 (DNS rebinding) is same-origin to itself, not to us.
        host = request.headers.get("host")
        if self.settings.insecure or host is None or is_loopback_host(host):
            return
        message = "an open gateway (no API keys) answers only on loopback"
        raise Denied(403, ErrorCode.FORBIDDEN, message)

    def _authenticate(self, request: AccessRequest, rule: Rule) -> Principal:
        token_ok = rule.access is Access.SESSION
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        secret = secret.strip()
        if not (scheme.lower() == "bearer" and secret):
            # Browser clients of the Realtime API offer the key as a subprotocol.
            scheme = "bearer"
            secret = _subprotocol_secret(request.subprotocols, KEY_SUBPROTOCOL) or ""
            if not secret:
                secret = _subprotocol_secret(request.subprotocols, OPENAI_KEY_SUBPROTOCOL) or ""
        try:
            if secret:
                if ClientTokens.looks_like_token(secret):
                    return self._token(secret, token_ok)
                return self.keys.check_key(secret)
            if token_ok:
                offered = _subprotocol_secret(request.subprotocols, TOKEN_SUBPROTOCOL)
                token = request.query.get("token") or offered
                if token:
                    return self._token(token, token_ok)
        except CredentialError as exc:
            raise _unauthorized(exc.message) from None
        wanted = "an API key or a client token" if token_ok else "an API key"
        raise _unauthorized(f"this route needs {wanted} (Authorization: Bearer)")

    def _token(self, token: str, token_ok: bool) -> Principal:
        if not token_ok:
            raise CredentialError("a client token only opens sessions; send an API key")
        return self.tokens.check(token)


def _unauthorized(message: str) -> Denied:
    return Denied(401, ErrorCode.UNAUTHORIZED, message, {"WWW-Authenticate": "Bearer"})


def _too_many(refusal: Refusal) -> Denied:
    return Denied(429, refusal.code, refusal.message, {"Retry-After": str(refusal.retry_after_s)})


def _subprotocol_secret(offered: tuple[str, ...], prefix: str) -> str | None:
    return next((p[len(prefix) :] for p in offered if p.startswith(prefix)), None)


def principal_of(connection: HTTPConnection | ClientSocket) -> Principal:
    """The caller of a request the middleware let through."""
    principal: Principal = connection.scope.get(PRINCIPAL_KEY, ANONYMOUS)
    return principal


class AuthMiddleware:
    """Carries out the gatekeeper's decisions for HTTP and WebSocket scopes."""

    def __init__(
        self,
        app: ASGIApp,
        gatekeeper: Gatekeeper,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.gatekeeper = gatekeeper
        self.on_refusal = on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        websocket = scope["type"] == "websocket"
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query or TOKEN_PARAM in query:
            # Keep client tokens out of access logs: uvicorn logs this very
            # scope's query string (routes never read the client token; a
            # resume token is read back from the scope's state).
            if TOKEN_PARAM in query:
                scope.setdefault("state", {})[TOKEN_PARAM] = query[TOKEN_PARAM]
            secret = ("token", TOKEN_PARAM)
            rest = {name: value for name, value in query.items() if name not in secret}
            scope["query_string"] = urlencode(rest).encode("latin-1")
        request = AccessRequest(
            method=WS if websocket else scope["method"],
            path=scope["path"],
            headers=Headers(scope=scope),
            query=query,
            subprotocols=tuple(scope.get("subprotocols") or ()),
            secure=scope.get("scheme") in ("https", "wss"),
        )
        try:
            rule, principal = self.gatekeeper.decide(request)
        except Denied as denied:
            await self._refuse(scope, receive, send, request, denied)
            return
        if websocket:
            send = _choosing_subprotocol(send, request.subprotocols)
        if principal is None:
            await self.app(scope, receive, send)
            return
        scope[PRINCIPAL_KEY] = principal
        limiter = self.gatekeeper.limiter
        # A resume continues a session that holds its place already.
        resuming = websocket and asks_resume(query, request.subprotocols)
        if not rule.opens_session or self.gatekeeper.open or resuming:
            await self.app(scope, receive, send)
            return
        refusal = limiter.open_session(principal)
        if refusal is not None:
            await self._refuse(scope, receive, send, request, _too_many(refusal))
            return
        try:
            await self.app(scope, receive, send)
        finally:
            limiter.close_session(principal)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, request: AccessRequest, denied: Denied
    ) -> None:
        if self.on_refusal is not None:
            self.on_refusal(denied.code)
        log.info("refused %s %s: %s (%s)", request.method, request.path, denied.code,
                 denied.message)  # fmt: skip
        if request.method == WS:
            await _deny_websocket(scope, receive, send, denied)
        else:
            await _deny_http(scope, receive, send, denied)


class DeniedUpgradeLogFilter(logging.Filter):
    """Drops uvicorn's "returned without completing handshake" error after an
    upgrade this middleware refused on purpose with a denial response (the
    sans-I/O implementation of uvicorn reports those as app errors)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_DENIED_UPGRADE.get() and "without completing handshake" in record.msg)


def install_log_filter() -> None:
    """Once per process: hide the spurious error of refused upgrades."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, DeniedUpgradeLogFilter) for f in logger.filters):
        logger.addFilter(DeniedUpgradeLogFilter())


def choose_subprotocol(offered: tuple[str, ...]) -> str | None:
    """The subprotocol to accept with: a browser that offered some fails the
    connection unless one is selected. ``map.realtime`` (the Realtime SDK's and
    its browser clients'), else ``omnilive``, else a credential one itself."""
    for known in (REALTIME_SUBPROTOCOL, OPENAI_SUBPROTOCOL, SUBPROTOCOL):
        if known in offered:
            return known
    credentials = (*CREDENTIAL_SUBPROTOCOLS, *RESUME_SUBPROTOCOLS)
    return next((p for p in offered if p.startswith(credentials)), None)


def _choosing_subprotocol(send: Send, offered: tuple[str, ...]) -> Send:
    chosen = choose_subprotocol(offered)
    if chosen is None:
        return send

    async def sending(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": chosen}
        await send(message)

    return sending


def _headers(denied: Denied) -> list[tuple[bytes, bytes]]:
    pairs = {"content-type": "application/json", **denied.headers}
    return [(k.lower().encode(), v.encode()) for k, v in pairs.items()]


async def _deny_http(scope: Scope, receive: Receive, send: Send, denied: Denied) -> None:
    body = denied.body()
    headers = [*_headers(denied), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": denied.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _deny_websocket(scope: Scope, receive: Receive, send: Send, denied: Denied) -> None:
    """Refuse the upgrade with an HTTP answer; nothing is accepted."""
    # Seen by the log filter: uvicorn logs from this connection's task after we return.
    _DENIED_UPGRADE.set(True)
    message: Any = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        body = denied.body()
        headers = [*_headers(denied), (b"content-length", str(len(body)).encode())]
        await send(
            {"type": "websocket.http.response.start", "status": denied.status, "headers": headers}
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": denied.code})
