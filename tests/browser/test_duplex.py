"""Full duplex in the browser on the scripted engine, with Chromium's fake
camera and microphone: results arrive once a second, subtitles show the
AI's words, force-listen and pause work, and the recording opens in the
session viewer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.harness import chromium, screenshot, start_session, watch
from tests.servers import Server

RESULTS = "window.omniliveDuplex.results.length"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with chromium(tmp_path_factory.mktemp("duplex")) as context:
        yield context


def _results_after(page, count: int, timeout: float = 15_000) -> None:
    page.wait_for_function(f"{RESULTS} >= {count}", timeout=timeout)


def test_omni_session(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page)
    try:
        start_session(page, scripted_server.http + "/omni")

        # The scripted plan is listen ×3, then speak ×3 (the last one ends the turn).
        page.wait_for_selector("#subtitle.visible", timeout=20_000)
        subtitle = page.inner_text("#subtitle")
        # The engine's text counts the frames it saw: the camera's frames arrived.
        assert "frames 1" in subtitle, subtitle
        assert page.evaluate("window.omniliveAudio.chunks") > 0, "the AI's audio was not played"
        assert page.get_attribute("#stage", "data-ai") in ("speaking", "listening")
        assert page.inner_text("[data-metric=kv]") != "—"
        assert page.inner_text("[data-metric=latency]").endswith("ms")
        assert page.inner_text("[data-metric=dropped]") == "0"
        screenshot(page, "omni-live")

        # Force-listen: every result after the first one sent with it is "listen".
        page.click("#force-listen")
        assert page.get_attribute("#force-listen", "aria-pressed") == "true"
        page.wait_for_function("window.omniliveDuplex.forceListenSent >= 1")
        marked = page.evaluate(RESULTS) + 1  # one result may already be on its way
        _results_after(page, marked + 4)
        after = page.evaluate(f"window.omniliveDuplex.results.slice({marked})")
        assert after and all(r["is_listen"] for r in after), after
        page.click("#force-listen")
        assert page.get_attribute("#force-listen", "aria-pressed") == "false"

        # Pause: the server confirms, results stop; resume: they come back.
        page.click("#pause")
        page.wait_for_function("window.omniliveDuplex.paused === true")
        assert page.get_attribute("#stage", "data-ai") == "paused"
        settled = page.evaluate(RESULTS)
        page.wait_for_timeout(2500)
        assert page.evaluate(RESULTS) <= settled + 1, "results kept coming while paused"
        paused_at = page.evaluate(RESULTS)
        page.click("#pause")
        page.wait_for_function("window.omniliveDuplex.paused === false")
        _results_after(page, paused_at + 2)

        page.click("#stop")
        link = page.locator("#transcript a[href^='/s/']")
        link.wait_for()
        viewer_url = link.get_attribute("href")
        assert problems.items == []
    finally:
        page.close()

    # The recording: units with frames and text, and the merged video replay.
    viewer = browser.new_page()
    problems = watch(viewer)
    try:
        viewer.goto(scripted_server.http + viewer_url)
        viewer.wait_for_selector("#timeline .entry.unit.speak")
        assert viewer.locator("#timeline img.thumb").count() > 0
        # The viewer follows the session until its replay is made.
        viewer.wait_for_selector("#replay video", timeout=30_000)
        screenshot(viewer, "session-omni")
        assert problems.items == []
    finally:
        viewer.close()


def test_audio_duplex_session(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page)
    try:
        start_session(page, scripted_server.http + "/audio_duplex")
        page.wait_for_selector("#subtitle.visible", timeout=20_000)
        assert "frames 0" in page.inner_text("#subtitle")  # audio only: no camera
        assert page.evaluate("window.omniliveAudio.chunks") > 0
        screenshot(page, "audio_duplex-live")
        page.click("#stop")
        page.locator("#transcript a[href^='/s/']").wait_for()
        assert problems.items == []
    finally:
        page.close()
