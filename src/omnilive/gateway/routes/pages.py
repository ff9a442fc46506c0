"""The browser pages: one HTML file per page, and their static ES modules
and CSS under ``/static`` (``src/omnilive/web/``, shipped as package data).

Pages are plain files with no server-side templating, except the session
viewer, which gets its recording id (escaped) so that it also works as a
page of plain links when scripts are off.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
PAGES_DIR = WEB_DIR / "pages"
STATIC_DIR = WEB_DIR / "static"

# Browsers must revalidate (cheaply, by ETag) so that a server upgrade never
# runs a page against stale modules.
_REVALIDATE = {"Cache-Control": "no-cache"}

PAGES: dict[str, str] = {
    "/": "index.html",
    "/turnbased": "turnbased.html",
    "/half_duplex": "half_duplex.html",
    "/audio_duplex": "audio_duplex.html",
    "/omni": "omni.html",
    "/admin": "admin.html",
}

router = APIRouter()


def _page_route(file: str) -> Callable[[], Awaitable[FileResponse]]:
    async def page() -> FileResponse:
        return FileResponse(PAGES_DIR / file, media_type="text/html", headers=_REVALIDATE)

    page.__name__ = f"page_{file.removesuffix('.html')}"
    return page


for _path, _file in PAGES.items():
    router.add_api_route(_path, _page_route(_file), methods=["GET"], include_in_schema=False)


def viewer_page(recording_id: str) -> HTMLResponse:
    """The session viewer for one (existing) recording."""
    template = (PAGES_DIR / "session.html").read_text(encoding="utf-8")
    body = template.replace("{{session_id}}", html.escape(recording_id, quote=True))
    return HTMLResponse(body, headers=_REVALIDATE)


class _WebFiles(StaticFiles):
    """Static files that browsers revalidate before each use."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_REVALIDATE)
        # ES modules must be served as JavaScript whatever the host's mime table says.
        if path.endswith(".js"):
            response.headers["content-type"] = "text/javascript; charset=utf-8"
        return response


def mount_pages(app: FastAPI) -> None:
    """Add the page routes and ``/static`` to the gateway."""
    app.include_router(router)
    app.mount("/static", _WebFiles(directory=STATIC_DIR), name="static")
