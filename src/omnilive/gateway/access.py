"""Which credential every gateway path needs: one table, read top to bottom.

Routes do not check credentials themselves; the auth middleware classifies
each request by method and path here before any route runs. A path that no
rule covers is refused, so a new route is closed until it is classified
(``tests/security/test_routes.py`` fails for it, naming this file).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

WS = "WS"  # the method name rules use for WebSocket upgrades


class Access(StrEnum):
    PUBLIC = "public"  # no credential: health, pages and their static files
    SESSION = "session"  # an API key or a client token (browsers opening a session)
    USER = "user"  # an API key, any role
    ADMIN = "admin"  # an API key with the admin role


@dataclass(frozen=True)
class Rule:
    """``path`` matches exactly, or every path that starts with it (``prefix``)."""

    methods: frozenset[str]  # empty: every method, WebSocket included
    path: str
    access: Access
    prefix: bool = False
    # A session holds a worker: counted against the key's concurrent sessions.
    opens_session: bool = False

    def matches(self, method: str, path: str) -> bool:
        if self.methods and method not in self.methods:
            return False
        return path.startswith(self.path) if self.prefix else path == self.path


def _rule(methods: str, path: str, access: Access, opens_session: bool = False) -> Rule:
    """A rule from a compact spelling: ``*`` for any method; a path ending
    in ``/`` (other than the root page) is a prefix."""
    names = frozenset(m for m in methods.split() if m != "*")
    prefix = path.endswith("/") and path != "/"
    return Rule(names, path, access, prefix, opens_session)


A = Access
RULES: tuple[Rule, ...] = (
    _rule("GET", "/health", A.PUBLIC),
    _rule("GET", "/static/", A.PUBLIC),
    # The viewer page of a recording; the data it shows is behind /api/sessions/.
    _rule("GET", "/s/", A.PUBLIC),
    _rule("*", "/api/admin/", A.ADMIN),
    _rule("*", "/metrics", A.ADMIN),
    _rule("GET", "/workers", A.ADMIN),  # internal addresses and pids
    _rule("GET", "/api/queue", A.ADMIN),  # lists other clients' session ids
    _rule("DELETE", "/api/queue/", A.ADMIN),
    _rule("*", "/api/config/", A.ADMIN),
    _rule("DELETE", "/api/assets/ref_audio/", A.ADMIN),
    _rule("POST", "/v1/client_secrets", A.USER),  # a token cannot mint tokens
    _rule("POST", "/v1/realtime/client_secrets", A.USER),  # the same, in OpenAI's shape
    _rule(WS, "/ws/", A.SESSION, opens_session=True),
    _rule(WS, "/v1/realtime", A.SESSION, opens_session=True),
    _rule(WS, "/v1/live/sessions", A.SESSION, opens_session=True),  # OpenAI's Live API
    _rule("POST", "/api/chat", A.USER, opens_session=True),
    # WebRTC signalling (docs/webrtc.md). The call's session runs under a
    # WebSocket scope of its own, classified (and counted) by the WS rules.
    _rule("POST", "/v1/realtime/calls", A.SESSION),
    _rule("POST", "/v1/realtime/calls/", A.SESSION),
    _rule("POST", "/v1/live/sessions", A.SESSION),  # the Live API's call and its hang-up
    _rule("POST", "/v1/live/sessions/", A.SESSION),
    _rule("GET POST", "/api/webrtc/", A.SESSION),
    # Reading a recording (its files are <audio src> and download links in pages).
    _rule("GET HEAD", "/api/sessions/", A.SESSION),
    _rule("*", "/api/", A.USER),
    _rule("GET", "/status", A.USER),
    _rule("GET", "/openapi.json", A.USER),
    _rule("GET", "/docs", A.USER),
    _rule("GET", "/docs/", A.USER),
    _rule("GET", "/redoc", A.USER),
)


class AccessTable:
    """The rules, with the browser pages (exact paths) public ahead of them."""

    def __init__(self, public_pages: Iterable[str], rules: tuple[Rule, ...] = RULES) -> None:
        pages = tuple(Rule(frozenset({"GET"}), path, A.PUBLIC) for path in sorted(public_pages))
        self.rules = pages + rules

    def classify(self, method: str, path: str) -> Rule | None:
        """The first rule for ``method`` (``WS`` for upgrades) and ``path``, or None."""
        method = "GET" if method == "HEAD" else method
        return next((rule for rule in self.rules if rule.matches(method, path)), None)
