"""The browser pages, and their static ES modules and CSS under ``/static``
(``src/omnilive/web/``, shipped as package data).

Each page is put together once, at import, from two files in ``web/pages/``:
``layout.html``, the shell every page shares (``<head>``, site header, the
``<main>`` element and its notice bar), and the page's fragment, which holds
only what goes inside ``<main>``. Both name what they take as ``{{name}}``
placeholders (see `_fill`): the layout the `Page` fields, a fragment its
`Page.slots` and the parts every fragment may use (`_SHARED`, the persona
settings). /audio_duplex and /omni share one fragment and differ only in
their slots. The pages are static, so a few replacements at startup do, and
no template library is needed; layout, fragments and parts are never served
as they are.

The session viewer alone is filled in per request: its recording id, escaped,
so that it also works as a page of plain links when scripts are off.
"""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
PAGES_DIR = WEB_DIR / "pages"
STATIC_DIR = WEB_DIR / "static"

# Browsers must revalidate (static files cheaply, by ETag; pages are small and
# sent whole) so that a server upgrade never runs a page against stale modules.
_REVALIDATE = {"Cache-Control": "no-cache"}

# Left in the session viewer for `viewer_page` to fill in per request.
_PER_REQUEST = frozenset({"session_id"})

_NAME = re.compile(r"\{\{(\w+)\}\}")
# A placeholder alone on its line (with the line's indentation), or any other.
_PLACEHOLDER = re.compile(
    r"^(?P<indent>[ \t]*)\{\{(?P<block>\w+)\}\}\n|\{\{(?P<inline>\w+)\}\}", re.MULTILINE
)


def _read(name: str) -> str:
    return (PAGES_DIR / name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Page:
    """One page: what the layout takes for it, and its fragment."""

    name: str  # <body data-page>, which the page's modules read
    title: str  # the i18n key of the page's title
    script: str  # its module, under /static/js/pages/, without ".js"
    fragment: str  # the file with what goes inside <main>
    main_class: str = "page layout"
    document_title: str = "omnilive"
    head: str = ""  # more lines for <head>, each with its newline
    slots: Mapping[str, str] = field(default_factory=dict)  # the fragment's own placeholders


def _fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with ``{{name}}`` replaced by ``values[name]``; other names stay.

    A placeholder alone on its line takes a block of lines, each indented like
    that line (and an empty block drops the line), so that fragments and parts
    are written flush left and the pages come out indented as one file. One
    pass: what a value brings in is not filled again.
    """

    def replace(match: re.Match[str]) -> str:
        if (name := match["block"]) is not None:
            return textwrap.indent(values[name], match["indent"]) if name in values else match[0]
        return values.get(match["inline"], match[0])

    return _PLACEHOLDER.sub(replace, template)


_LAYOUT = _read("layout.html")
_SHARED = {"persona": _read("persona.html")}


def render(page: Page) -> str:
    """The page's whole HTML document."""
    main = _fill(_read(page.fragment), {**_SHARED, **page.slots})
    document = _fill(
        _LAYOUT,
        {
            "title": page.title,
            "head": page.head,
            "document_title": page.document_title,
            "script": page.script,
            "page": page.name,
            "main_class": page.main_class,
            "main": main,
        },
    )
    # A misspelt or forgotten slot fails at startup, not as "{{...}}" on screen.
    if left := set(_NAME.findall(document)) - _PER_REQUEST:
        raise ValueError(f"{page.fragment}: nothing fills {sorted(left)}")
    return document


def _duplex(mode: str, kind: str, settings: str = "") -> Page:
    """/audio_duplex or /omni: the one duplex fragment, with the kind's stage."""
    return Page(
        name=mode,
        title=f"mode.{mode}",
        script="duplex",
        fragment="duplex.html",
        slots={
            "heading": f"mode.{mode}",
            "about": f"duplex.about_{kind}",
            "stage": _read(f"duplex_{kind}_stage.html"),
            "settings": settings,
        },
    )


PAGES: dict[str, Page] = {
    "/": Page(
        name="home", title="nav.home", script="home", fragment="index.html", main_class="page"
    ),
    "/turnbased": Page(
        name="turnbased", title="mode.turnbased", script="turnbased", fragment="turnbased.html"
    ),
    "/half_duplex": Page(
        name="half_duplex",
        title="mode.half_duplex",
        script="half_duplex",
        fragment="half_duplex.html",
    ),
    "/audio_duplex": _duplex("audio_duplex", "audio"),
    "/omni": _duplex("omni", "omni", settings=_read("duplex_omni_settings.html")),
    "/admin": Page(
        name="admin",
        title="nav.admin",
        script="admin",
        fragment="admin.html",
        main_class="page admin",
    ),
}

VIEWER = Page(
    name="session",
    title="viewer.title",
    script="session",
    fragment="session.html",
    main_class="page viewer",
    document_title="omnilive session",
    head='<meta name="session-id" content="{{session_id}}">\n',
)

router = APIRouter()


def _page_route(page: Page) -> Callable[[], Awaitable[HTMLResponse]]:
    document = render(page)

    async def serve() -> HTMLResponse:
        return HTMLResponse(document, headers=_REVALIDATE)

    serve.__name__ = f"page_{page.name}"
    return serve


for _path, _page in PAGES.items():
    router.add_api_route(_path, _page_route(_page), methods=["GET"], include_in_schema=False)

_VIEWER = render(VIEWER)


def viewer_page(recording_id: str) -> HTMLResponse:
    """The session viewer for one (existing) recording."""
    body = _VIEWER.replace("{{session_id}}", html.escape(recording_id, quote=True))
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
