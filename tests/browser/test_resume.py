"""The pages resume a dropped session (docs/resume.md): the omni duplex page,
scripted engine, loaded through a TCP proxy that the test cuts mid-session, over
the WebSocket (a WebRTC call does not resume: docs/webrtc.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.browser.harness import chromium, run_async, start_session
from tests.servers import Server
from tests.tcp_proxy import ProxyThread

RESULTS = "window.omniliveDuplex.results.length"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with chromium(tmp_path_factory.mktemp("resume")) as context:
        yield context


def test_the_duplex_page_resumes_after_a_cut(browser, scripted_server: Server) -> None:
    with ProxyThread(scripted_server.port) as proxy:
        page = browser.new_page()
        kinds: list[list[str]] = []  # the types each socket received

        def track(ws) -> None:
            seen: list[str] = []
            kinds.append(seen)
            ws.on("framereceived", lambda frame: seen.append(json.loads(frame)["type"]))

        page.on("websocket", track)
        try:
            start_session(page, f"http://127.0.0.1:{proxy.port}/omni?transport=websocket")
            page.wait_for_function(f"{RESULTS} >= 2", timeout=20_000)
            proxy.cut()
            page.wait_for_function("document.body.innerText.includes('Reconnected')")
            before = page.evaluate(RESULTS)
            page.wait_for_function(f"{RESULTS} >= {before + 2}", timeout=20_000)
            assert len(kinds) == 2, kinds  # the session's socket, then the resumed one
            assert kinds[1][0] == "session.resumed" and "result" in kinds[1]
            assert page.get_attribute("#stage", "data-ai") in ("speaking", "listening")
            # Ended from the page, not by closing it: a close that the proxy's
            # teardown cuts short is a drop, and a dropped session is held
            # (suspended) for the resume grace on the server the next tests share.
            page.click("#stop")
            run_async(scripted_server.wait_idle())
        finally:
            page.close()
