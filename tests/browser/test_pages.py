"""Every page loads with no console error and no failed request, in both
languages, at desktop and phone size; each is saved as a screenshot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.harness import DESKTOP, PHONE, chromium, run_async, screenshot, watch
from tests.servers import Server, chat_once, user

PAGES = {
    "home": "/",
    "turnbased": "/turnbased",
    "half_duplex": "/half_duplex",
    "audio_duplex": "/audio_duplex",
    "omni": "/omni",
    "admin": "/admin",
}


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with chromium(tmp_path_factory.mktemp("pages")) as context:
        yield context


@pytest.fixture(scope="module")
def recording_id(scripted_server: Server) -> str:
    """A finished chat recording, for the session viewer."""
    messages = run_async(chat_once(scripted_server, user("Hello there, viewer")))
    assert messages[-1]["type"] == "done", messages
    return messages[-1]["recording_session_id"]


def _load(browser, url: str, ready: str, name: str, size: dict) -> list[str]:
    page = browser.new_page()
    problems = watch(page)
    try:
        page.set_viewport_size(size)
        page.goto(url)
        page.wait_for_selector(ready, state="attached")
        page.wait_for_load_state("networkidle")
        screenshot(page, name)
        # Nothing may scroll sideways on a phone.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name}: {overflow}px wider than the screen"
        return problems.items
    finally:
        page.close()


# What tells that each page has drawn its live parts.
READY = {
    "home": "#modes .mode-card",
    "turnbased": "body[data-ready]",
    "half_duplex": "body[data-ready]",
    "audio_duplex": "body[data-ready]",
    "omni": "body[data-ready]",
    "admin": "#workers tbody tr[data-worker]",
}


@pytest.mark.parametrize("name", list(PAGES))
def test_page_loads_cleanly(browser, scripted_server: Server, name: str) -> None:
    url = scripted_server.http + PAGES[name]
    for size_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        problems = _load(browser, url, READY[name], f"{name}-{size_name}", size)
        assert problems == [], f"{name} ({size_name}): {problems}"


def test_session_viewer(browser, scripted_server: Server, recording_id: str) -> None:
    url = f"{scripted_server.http}/s/{recording_id}"
    for size_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        problems = _load(browser, url, "#timeline .entry", f"session-{size_name}", size)
        assert problems == [], problems
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_selector("#timeline .entry")
        assert "Hello there, viewer" in page.inner_text("#timeline")
        assert page.locator("#replay audio").count() == 1
        page.fill("#comment", "checked in the browser")
        page.click("#comment-form button[type=submit]")
        page.wait_for_function("document.querySelector('#comment-status').textContent !== ''")
        page.reload()
        page.wait_for_function(
            "document.querySelector('#comment').value === 'checked in the browser'"
        )
    finally:
        page.close()


def test_language_switch_is_remembered(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page)
    try:
        page.goto(scripted_server.http + "/")
        page.wait_for_selector("#modes .mode-card")
        page.click("#lang-switch")
        assert page.inner_text("h1") == "与全模态模型实时对话"
        page.goto(scripted_server.http + "/half_duplex")
        page.wait_for_selector("body[data-ready]", state="attached")
        assert page.inner_text("#start") == "开始"
        assert page.get_attribute("html", "lang") == "zh-CN"
        screenshot(page, "half_duplex-zh")
        page.click("#lang-switch")
        assert page.inner_text("#start") == "Start"
        assert problems.items == []
    finally:
        page.evaluate("localStorage.removeItem('omnilive.lang')")
        page.close()


def test_static_files_are_package_data() -> None:
    """The pages ship inside the package (pyproject's package-data), not beside it."""
    web = Path(__file__).resolve().parents[2] / "src" / "omnilive" / "web"
    assert (web / "pages" / "index.html").is_file()
    assert (web / "static" / "js" / "lib" / "api.js").is_file()
