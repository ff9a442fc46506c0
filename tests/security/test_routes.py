"""Every route of the real gateway app, found by walking ``app.routes``, is
classified and refuses missing, wrong and expired credentials; admin routes
refuse user keys. A route added later is picked up here automatically."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount, WebSocketRoute
from starlette.testclient import WebSocketDenialResponse

from omnilive.gateway.access import WS, Access
from omnilive.gateway.auth import Gatekeeper
from omnilive.gateway.routes.pages import PAGES
from tests.security.conftest import ADMIN_KEY, EXPIRED_KEY, USER_KEY, WRONG_KEY, bearer

try:  # FastAPI ≥ 0.130 nests included routers; this walks them
    from fastapi.routing import iter_route_contexts
except ImportError:  # pragma: no cover - older FastAPI has flat routes
    iter_route_contexts = None


@dataclass(frozen=True)
class Endpoint:
    method: str  # HTTP method, or WS
    path: str  # with every parameter filled in

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def _concrete(template: str) -> str:
    return re.sub(r"\{[^}:]+:path\}", "x0/y0", re.sub(r"\{[^}:]+\}", "x0", template))


def endpoints(app: FastAPI) -> Iterator[Endpoint]:
    """Every method and path the app answers (a mount by one sample file)."""
    routes = list(iter_route_contexts(app.routes)) if iter_route_contexts else app.routes
    for route in routes:
        original = getattr(route, "original_route", route)
        path = getattr(route, "path_format", None) or route.path
        if isinstance(original, Mount):
            yield Endpoint("GET", f"{original.path}/js/lib/api.js")
        elif isinstance(original, WebSocketRoute) or route.methods is None:
            yield Endpoint(WS, _concrete(path))
        else:
            for method in sorted(route.methods - {"HEAD"}):
                yield Endpoint(method, _concrete(path))


def attempt(client: TestClient, endpoint: Endpoint, headers: dict[str, str]) -> int:
    """The HTTP status of a request, or of a WebSocket upgrade (101 if accepted)."""
    if endpoint.method != WS:
        return client.request(endpoint.method, endpoint.path, headers=headers).status_code
    try:
        with client.websocket_connect(endpoint.path, headers=headers):
            return 101
    except WebSocketDenialResponse as denied:
        return denied.status_code


@pytest.fixture(scope="module")
def all_endpoints(keyed_app: tuple[FastAPI, TestClient]) -> list[Endpoint]:
    found = list(endpoints(keyed_app[0]))
    assert len(found) > 30, found  # the walk found the routers' routes
    return found


def _access(app: FastAPI, endpoint: Endpoint) -> Access:
    gatekeeper: Gatekeeper = app.state.auth
    rule = gatekeeper.table.classify(endpoint.method, endpoint.path)
    assert rule is not None, f"{endpoint} is not classified in gateway/access.py"
    return rule.access


def test_every_route_is_classified_and_only_pages_health_and_static_are_public(
    keyed_app, all_endpoints
):
    app, _ = keyed_app
    public = {str(e) for e in all_endpoints if _access(app, e) is Access.PUBLIC}
    pages = {f"GET {path}" for path in PAGES}
    expected = {"GET /health", "GET /static/js/lib/api.js", "GET /s/x0", *pages}
    assert public == expected & {str(e) for e in all_endpoints}
    # the session routes and the known admin actions are where they belong
    assert _access(app, Endpoint(WS, "/ws/chat")) is Access.SESSION
    assert _access(app, Endpoint(WS, "/v1/realtime")) is Access.SESSION
    for admin in ("DELETE /api/queue/x0", "PUT /api/config/eta", "PUT /api/admin/apps/x0",
                  "DELETE /api/assets/ref_audio/x0", "GET /metrics",
                  "GET /api/admin/live"):  # fmt: skip
        method, path = admin.split()
        assert _access(app, Endpoint(method, path)) is Access.ADMIN, admin


def test_every_protected_route_refuses_missing_wrong_and_expired_credentials(
    keyed_app, all_endpoints
):
    app, client = keyed_app
    gatekeeper: Gatekeeper = app.state.auth
    alice = gatekeeper.keys.check_key(USER_KEY)
    expired_token, _ = gatekeeper.tokens.mint(alice, ttl_s=-1)
    checked = 0
    for endpoint in all_endpoints:
        if _access(app, endpoint) is Access.PUBLIC:
            continue
        cases = {
            "no credential": {},
            "a wrong key": bearer(WRONG_KEY),
            "an expired key": bearer(EXPIRED_KEY),
            "an expired client token": bearer(expired_token),
            "a malformed token": bearer(expired_token[:-4] + "AAAA"),
            "a non-bearer scheme": {"Authorization": f"Basic {USER_KEY}"},
        }
        for what, headers in cases.items():
            assert attempt(client, endpoint, headers) == 401, f"{endpoint} with {what}"
        if endpoint.method == WS:
            status = attempt(client, endpoint, {})
            query = Endpoint(WS, f"{endpoint.path}?token={expired_token}")
            assert attempt(client, query, {}) == 401, f"{endpoint} with an expired ?token="
            assert status == 401
        checked += 1
    assert checked > 25


def test_admin_routes_refuse_user_keys_and_client_tokens_but_admit_admins(keyed_app, all_endpoints):
    app, client = keyed_app
    gatekeeper: Gatekeeper = app.state.auth
    admin_token, _ = gatekeeper.tokens.mint(gatekeeper.keys.check_key(ADMIN_KEY), ttl_s=60)
    admin_routes = [e for e in all_endpoints if _access(app, e) is Access.ADMIN]
    assert len(admin_routes) >= 6
    for endpoint in admin_routes:
        assert attempt(client, endpoint, bearer(USER_KEY)) == 403, endpoint
        assert attempt(client, endpoint, bearer(admin_token)) == 401, endpoint
        assert attempt(client, endpoint, bearer(ADMIN_KEY)) not in (401, 403), endpoint


def test_user_routes_admit_keys_and_refuse_tokens(keyed_app, all_endpoints):
    app, client = keyed_app
    gatekeeper: Gatekeeper = app.state.auth
    token, _ = gatekeeper.tokens.mint(gatekeeper.keys.check_key(USER_KEY), ttl_s=60)
    for endpoint in all_endpoints:
        access = _access(app, endpoint)
        if access is Access.USER:
            assert attempt(client, endpoint, bearer(token)) == 401, endpoint
        if access in (Access.USER, Access.SESSION):
            if endpoint.path == "/api/default_ref_audio":
                continue  # speaks a sample with espeak-ng: its own tests cover it
            assert attempt(client, endpoint, bearer(USER_KEY)) not in (401, 403), endpoint
        if access is Access.SESSION:
            assert attempt(client, endpoint, bearer(token)) not in (401, 403), endpoint
