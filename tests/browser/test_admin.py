"""The admin page against a real server: switching a mode off hides it on the
home page and refuses its WebSocket; a queued request shows its place and
countdown on its own page and can be cancelled from the admin page; a stored
voice can be deleted."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.browser.harness import chromium, screenshot, spoken_wav, start_session, watch
from tests.servers import Server

# Opens a duplex WebSocket from the page and reports what the server did with it.
PROBE_WS = """async (url) => new Promise((resolve) => {
    const ws = new WebSocket(url);
    const seen = [];
    ws.onmessage = (event) => seen.push(JSON.parse(event.data));
    ws.onclose = (event) => resolve({code: event.code, messages: seen});
})"""


@contextlib.contextmanager
def duplex_session(browser, server: Server) -> Iterator:
    """A page holding an audio duplex session (and a slot) until the block ends,
    which stops it and waits for its recording link; the page must show no problem."""
    page = browser.new_page()
    problems = watch(page)
    try:
        start_session(page, server.http + "/audio_duplex")
        page.wait_for_function("window.omniliveDuplex.results.length > 0")
        yield page
    finally:
        page.click("#stop")
        page.locator("#transcript a[href^='/s/']").wait_for()
        page.close()
    assert problems.items == []


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with chromium(tmp_path_factory.mktemp("admin")) as context:
        yield context


def test_switching_a_mode_off(browser, scripted_server: Server) -> None:
    admin = browser.new_page()
    problems = watch(admin)
    try:
        admin.goto(scripted_server.http + "/admin")
        switch = admin.locator("input[data-app=omni]")
        switch.wait_for(state="attached")
        assert switch.is_checked()
        admin.click("label.switch:has(input[data-app=omni])")
        admin.wait_for_selector("#notice.ok")
        assert not switch.is_checked()
        screenshot(admin, "admin-omni-off")

        home = browser.new_page()
        home_problems = watch(home)
        home.goto(scripted_server.http + "/")
        home.wait_for_selector("#modes .mode-card")
        assert home.locator("[data-mode=omni]").count() == 0
        assert home.locator("[data-mode=audio_duplex]").count() == 1
        assert home.is_hidden("#site-header a[data-id=omni]")

        # The mode's own page says so and will not start.
        home.goto(scripted_server.http + "/omni")
        home.wait_for_selector("body[data-ready]", state="attached")
        assert home.is_disabled("#start")
        assert "switched off" in home.inner_text("#notice")

        # And its WebSocket is refused: an app_disabled error, then close 1008.
        url = scripted_server.ws + "/ws/duplex/odx_probe?mode=omni"
        outcome = home.evaluate(PROBE_WS, url)
        assert outcome["code"] == 1008, outcome
        assert outcome["messages"][-1]["code"] == "app_disabled", outcome
        home.close()
        assert home_problems.items == []

        admin.click("label.switch:has(input[data-app=omni])")
        admin.wait_for_function("document.querySelector('input[data-app=omni]').checked")
        assert problems.items == []
    finally:
        admin.close()
        # Leave the shared server as it was, whatever happened above.
        httpx.put(f"{scripted_server.http}/api/admin/apps/omni", json={"enabled": True})


def test_queue_position_and_cancel(browser, scripted_server: Server) -> None:
    waiting = browser.new_page()
    admin = browser.new_page()
    problems = [watch(waiting), watch(admin)]
    try:
        with duplex_session(browser, scripted_server):  # holds the only worker
            waiting.goto(scripted_server.http + "/turnbased")
            waiting.wait_for_selector("body[data-ready]", state="attached")
            waiting.fill("#input", "Am I next?")
            waiting.click("#send")
            waiting.wait_for_selector("#queue[data-position='1']")
            assert "number 1" in waiting.inner_text("#queue")
            # An estimate: the time left, or, once the running session has
            # outlasted its estimate (a loaded machine), "any moment now".
            eta = waiting.inner_text("#queue .queue-eta")
            assert "left" in eta or eta == "any moment now", eta
            screenshot(waiting, "turnbased-queued")

            admin.goto(scripted_server.http + "/admin")
            row = admin.locator("#queue-table tr[data-ticket]")
            row.wait_for()
            assert "chat" in row.inner_text()
            assert admin.locator("#running tbody tr").count() == 1
            screenshot(admin, "admin-queue")
            row.locator("button").click()
            admin.wait_for_selector("#queue-table td.empty")

            # The waiting page is told, and can ask again.
            waiting.wait_for_selector(".msg.assistant.failed")
            assert waiting.is_hidden("#queue")
            assert "administrator" in waiting.inner_text("#notice")
            assert waiting.is_enabled("#send")
    finally:
        for page in (waiting, admin):
            page.close()
    for seen in problems:
        assert seen.items == []


def test_deleting_a_stored_voice(browser, scripted_server: Server, tmp_path: Path) -> None:
    wav = spoken_wav(tmp_path / "guest.wav", "A voice to delete.", silence_s=0.2)
    with wav.open("rb") as file:
        created = httpx.post(
            f"{scripted_server.http}/api/assets/ref_audio",
            files={"file": ("guest.wav", file, "audio/wav")},
            data={"name": "guest voice"},
        )
    assert created.status_code == 201, created.text
    voice_id = created.json()["id"]
    admin = browser.new_page()
    problems = watch(admin)
    try:
        admin.goto(scripted_server.http + "/admin")
        row = admin.locator(f"#voices tr[data-voice='{voice_id}']")
        row.wait_for()
        assert "guest voice" in row.inner_text()
        admin.once("dialog", lambda dialog: dialog.accept())
        row.locator("button").click()
        row.wait_for(state="detached")
        listed = httpx.get(f"{scripted_server.http}/api/assets/ref_audio").json()["ref_audios"]
        assert voice_id not in [voice["id"] for voice in listed]
        assert problems.items == []
    finally:
        admin.close()


def test_live_charts_draw_and_move(browser, scripted_server: Server) -> None:
    """The last minutes: a running duplex session shows up as a worker's slot in
    use and its units' latency, and the charts move as samples come in; its
    context has a row of its own."""
    admin = browser.new_page()
    problems = watch(admin)
    try:
        with duplex_session(browser, scripted_server):
            admin.goto(scripted_server.http + "/admin")
            latency = admin.locator("#live [data-worker] [data-chart=latency]")
            # A sample whose window held this session's units: a p50 line is drawn.
            admin.wait_for_function(
                "[...document.querySelectorAll('#live [data-chart=latency] polyline.p50')]"
                ".some((line) => line.getAttribute('points').includes(' '))",
                timeout=20_000,
            )
            assert admin.locator("#live [data-chart=latency] line.guide").count() >= 1
            assert admin.locator("#live [data-chart=slots]").count() >= 1
            queue = admin.locator("#live [data-live=queue] [data-chart=queue_length]")
            assert queue.locator("polyline").count() >= 1
            worker = latency.first.locator("xpath=ancestor::*[@data-worker]").get_attribute(
                "data-worker"
            )
            before = latency.first.inner_html()
            assert int(admin.locator("#live").get_attribute("data-samples")) >= 1
            newest = float(admin.locator("#live").get_attribute("data-newest"))
            # The charts move: a later refresh brings newer samples and redraws
            # the lines (the ring's length stops growing at five minutes).
            admin.wait_for_function(
                f"Number(document.querySelector('#live').dataset.newest) > {newest}",
                timeout=20_000,
            )
            admin.wait_for_function(
                "(before) => document.querySelector('#live [data-chart=latency]')"
                ".innerHTML !== before",
                arg=before,
                timeout=20_000,
            )
            busy = admin.locator(f"#live [data-worker='{worker}'] [data-chart=slots] figcaption")
            assert "1" in busy.inner_text()
            # The session's context: its row names it and its worker, and how full it is.
            session_id = admin.locator("#running tbody code").first.inner_text()
            context = admin.locator(f"#contexts tr[data-session='{session_id}']")
            context.wait_for()
            cells = context.locator("td").all_inner_texts()
            assert cells[:2] == [session_id, worker], cells
            used, capacity = (int(n) for n in cells[2].split(" / "))
            assert 0 < used <= capacity, cells
            assert context.locator("meter").count() == 1 and cells[3].endswith("%"), cells
            screenshot(admin, "admin-live")
    finally:
        admin.close()
    assert problems.items == []
