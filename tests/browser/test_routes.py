"""The page routes in process (no browser): every page is HTML, put together
from the layout and its fragment, static files are revalidated and modules
typed as JavaScript, the page sources are never served raw, and the session
viewer gets its id escaped."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from omnilive.gateway.routes import pages


def _client() -> TestClient:
    app = FastAPI()
    pages.mount_pages(app)
    return TestClient(app)


def test_every_page_is_served() -> None:
    client = _client()
    for path, page in pages.PAGES.items():
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert response.headers["cache-control"] == "no-cache"
        assert response.text == pages.render(page)
        assert f'<body data-page="{page.name}">' in response.text


def test_every_page_file_is_used() -> None:
    """Each line of the layout, every fragment and every part reaches some
    page: no file in pages/ is left behind unused."""
    served = {
        line.strip()
        for document in [*map(pages.render, pages.PAGES.values()), pages.render(pages.VIEWER)]
        for line in document.splitlines()
    }
    for file in pages.PAGES_DIR.glob("*.html"):
        for line in file.read_text(encoding="utf-8").splitlines():
            if "{{" not in line:
                assert line.strip() in served, f"{file.name}: {line.strip()}"


def test_static_files() -> None:
    client = _client()
    module = client.get("/static/js/lib/api.js")
    assert module.status_code == 200
    assert module.headers["content-type"].startswith("text/javascript")
    assert module.headers["cache-control"] == "no-cache"
    assert client.get("/static/css/app.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/js/nope.js").status_code == 404


def test_page_sources_are_not_served() -> None:
    """The layout and the fragments are only read to build the pages."""
    client = _client()
    for file in pages.PAGES_DIR.glob("*.html"):
        for url in (f"/{file.name}", f"/pages/{file.name}", f"/static/../pages/{file.name}"):
            assert client.get(url).status_code == 404, url


def test_pages_reference_only_local_files() -> None:
    """No CDN, no external URL: the pages work on a machine without internet."""
    for path in [*pages.PAGES_DIR.glob("*.html"), *pages.STATIC_DIR.rglob("*.*")]:
        # The SVG namespace is a name, not a URL anything is fetched from.
        text = path.read_text(encoding="utf-8").replace("http://www.w3.org/2000/svg", "")
        for marker in ("http://", "https://", "//cdn"):
            assert marker not in text, f"{path.name} refers to {marker}"


def test_viewer_escapes_the_id() -> None:
    page = pages.viewer_page('x"><script>alert(1)</script>')
    assert "<script>alert(1)</script>" not in page.body.decode()
    assert "&lt;script&gt;" in page.body.decode()
    assert "{{" not in page.body.decode()
