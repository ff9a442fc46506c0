"""The pages on a server with API keys, in Chromium: the key prompt appears,
a wrong key is refused, a user key runs a duplex session (its WebSocket
opened with a client token, never the key), the recording's replays load
with a token, the admin page asks for an admin key, and signing out forgets
the key."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.browser.conftest import _serve
from tests.browser.harness import chromium, screenshot, watch
from tests.servers import Server

USER_KEY = "ol-browser-user-key-0123456789"
ADMIN_KEY = "ol-browser-admin-key-0123456789"
KEYS = [
    {"key": USER_KEY, "role": "user", "name": "browser-user"},
    {"key": ADMIN_KEY, "role": "admin", "name": "browser-admin"},
]
# Refusals a page meets before it has the right key: expected, not problems
# (Chromium also logs each one to the console).
REFUSED = ("HTTP 401", "HTTP 403", "status of 401", "status of 403")


def _signed_in(problems) -> None:
    """From here on the page has its key: any refusal is a problem."""
    assert all(any(f in item for f in REFUSED) for item in problems.items), problems.items
    problems.items.clear()
    problems.allowed = ()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"OMNILIVE_AUTH__KEYS": json.dumps(KEYS)}
    yield from _serve(tmp_path_factory, "scripted", name="auth", env=env, api_key=ADMIN_KEY)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with chromium(tmp_path_factory.mktemp("auth")) as context:
        yield context


def _sign_in(page, key: str, reason: str) -> None:
    """Answer the key prompt, which must be asking for ``reason``."""
    dialog = page.wait_for_selector("dialog#login[open]")
    assert reason in page.inner_text("dialog#login .login-reason")
    page.fill("#login-key", key)
    page.click("#login-submit")
    # Gone; another prompt may follow at once if the key is refused.
    page.wait_for_function("dialog => !dialog.isConnected", arg=dialog)


def test_user_key_runs_a_session(browser, keyed_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page, allowed=REFUSED)
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    try:
        page.goto(keyed_server.http + "/audio_duplex?transport=websocket")
        _sign_in(page, "not-a-key", "needs an API key")
        screenshot(page, "auth-prompt")
        # The wrong key comes back with the prompt saying so.
        _sign_in(page, USER_KEY, "did not accept")
        page.wait_for_selector("body[data-ready]", state="attached")
        _signed_in(problems)
        page.wait_for_selector("#sign-out")
        assert page.evaluate("sessionStorage.getItem('omnilive.apiKey')") == USER_KEY
        assert page.evaluate("localStorage.getItem('omnilive.apiKey')") is None

        page.click("#start")
        page.wait_for_selector("#subtitle.visible", timeout=20_000)
        assert page.evaluate("window.omniliveAudio.chunks") > 0
        page.click("#stop")
        link = page.locator("#transcript a[href^='/s/']")
        link.wait_for()
        viewer_url = link.get_attribute("href")
        assert sockets, "no WebSocket was opened"
        # The token rode as a subprotocol: neither it nor the key is in any URL.
        assert all(USER_KEY not in url and "token=" not in url for url in sockets), sockets
        assert problems.items == []
    finally:
        page.close()

    # The recording viewer (same tab storage is per page here: sign in again)
    # loads the replay through links that carry a token.
    viewer = browser.new_page()
    problems = watch(viewer, allowed=REFUSED)
    media: list[tuple[int, str]] = []
    viewer.on("response", lambda r: "/assets/" in r.url and media.append((r.status, r.url)))
    try:
        viewer.goto(keyed_server.http + viewer_url)
        _sign_in(viewer, USER_KEY, "needs an API key")
        viewer.wait_for_selector("#timeline .entry.unit.speak")
        _signed_in(problems)
        viewer.wait_for_selector("#replay audio", timeout=30_000)
        viewer.wait_for_function("document.querySelector('#replay audio').readyState >= 1")
        assert media and all(status < 400 for status, _ in media), media
        assert all("token=" in url and USER_KEY not in url for _, url in media), media
        download = viewer.get_attribute("#download", "href")
        assert "token=" in download and USER_KEY not in download
        assert problems.items == []
    finally:
        viewer.close()


def test_admin_page_needs_an_admin_key(browser, keyed_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page, allowed=REFUSED)
    try:
        page.goto(keyed_server.http + "/admin")
        _sign_in(page, USER_KEY, "needs an API key")
        # The user key is good but not an admin's: the prompt asks for one.
        _sign_in(page, ADMIN_KEY, "admin key")
        page.wait_for_selector("input[data-app=omni]", state="attached")
        assert page.evaluate("sessionStorage.getItem('omnilive.apiKey')") == ADMIN_KEY
        _signed_in(problems)

        # Signing out forgets the key: the next load asks again.
        page.click("#sign-out")
        page.wait_for_selector("dialog#login[open]")
        assert page.evaluate("sessionStorage.getItem('omnilive.apiKey')") is None
        page.click("#login-cancel")
        page.wait_for_selector("dialog#login", state="detached")
        # Cancelled: the page's other refused requests do not ask again; the
        # header offers to sign in, which asks and starts the page over.
        page.wait_for_selector("#sign-in")
        page.wait_for_timeout(500)
        assert page.locator("dialog#login").count() == 0
        page.click("#sign-in")
        page.fill("#login-key", ADMIN_KEY)
        page.click("#login-submit")
        page.wait_for_selector("input[data-app=omni]", state="attached")
        assert page.locator("#sign-out").count() == 1
        others = [item for item in problems.items if not any(f in item for f in REFUSED)]
        assert others == []
    finally:
        page.close()
