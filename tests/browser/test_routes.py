"""The page routes in process (no browser): every page is HTML, static files
are revalidated and modules typed as JavaScript, and the session viewer gets
its id escaped."""

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
    for path, file in pages.PAGES.items():
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert response.headers["cache-control"] == "no-cache"
        assert (pages.PAGES_DIR / file).read_text(encoding="utf-8") == response.text


def test_static_files() -> None:
    client = _client()
    module = client.get("/static/js/lib/api.js")
    assert module.status_code == 200
    assert module.headers["content-type"].startswith("text/javascript")
    assert module.headers["cache-control"] == "no-cache"
    assert client.get("/static/css/app.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/js/nope.js").status_code == 404
    assert client.get("/static/../pages/index.html").status_code == 404


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
