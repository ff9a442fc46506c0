"""The HTTP reference names every HTTP route the gateway answers (found by
walking the real app's routes), but the pages and FastAPI's own API docs."""

from __future__ import annotations

import re

from fastapi.routing import iter_route_contexts
from starlette.routing import Mount, WebSocketRoute
from tools.docgen import DOCS

from omnilive.config import Settings
from omnilive.gateway.app import create_app
from omnilive.gateway.routes.pages import PAGES

FASTAPI_OWN = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def _shape(path: str) -> str:
    """A path with its parameters unnamed: ``/a/{id}`` and ``/a/{session_id}`` match."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def http_routes() -> list[str]:
    app = create_app(Settings(internal_token="docs-test"))
    paths = []
    for route in iter_route_contexts(app.routes):
        original = getattr(route, "original_route", route)
        if isinstance(original, Mount | WebSocketRoute) or route.methods is None:
            continue
        paths.append(getattr(route, "path_format", None) or route.path)
    return paths


def test_every_http_route_is_in_the_reference() -> None:
    page = _shape((DOCS / "reference" / "http.md").read_text(encoding="utf-8"))
    routes = http_routes()
    assert len(routes) > 30  # the walk found the routers' routes
    missing = [p for p in routes if p not in FASTAPI_OWN | set(PAGES) and _shape(p) not in page]
    assert not missing, f"docs/reference/http.md does not name {missing}"
