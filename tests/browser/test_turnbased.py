"""Turn-based chat in the browser: a typed question gets a streamed answer,
with its speech scheduled for playback, and the conversation goes on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.harness import chromium, screenshot, spoken_wav, watch
from tests.recordings import png
from tests.servers import Server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with chromium(tmp_path_factory.mktemp("turnbased")) as context:
        yield context


def test_typed_question_gets_a_streamed_answer(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page)
    try:
        page.goto(scripted_server.http + "/turnbased")
        page.wait_for_selector("body[data-ready]", state="attached")
        page.fill("#input", "What colour is the sky on a clear day?")
        page.click("#send")
        answer = page.locator(".msg.assistant[data-done=true]").first
        answer.wait_for()
        text = answer.locator(".text").inner_text()
        # The scripted engine answers with what it was asked.
        assert "What colour is the sky" in text
        assert int(answer.get_attribute("data-chunks")) > 1, "the answer came in one piece"
        assert page.evaluate("window.omniliveAudio.chunks") > 0, "no speech was played"
        assert "recording" in answer.inner_text()

        # A second question carries the first exchange (the protocol is stateless).
        page.fill("#input", "And at night?")
        page.keyboard.press("Enter")
        page.locator(".msg.assistant[data-done=true]").nth(1).wait_for()
        assert page.locator(".msg.user").count() == 2
        assert page.is_enabled("#send")
        screenshot(page, "turnbased-conversation")
        assert problems.items == []
    finally:
        page.close()


def test_stop_ends_the_answer(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    problems = watch(page)
    try:
        page.goto(scripted_server.http + "/turnbased")
        page.wait_for_selector("body[data-ready]", state="attached")
        # A slow answer (the scripted engine sleeps per step) that is stopped midway.
        page.fill("#system-prompt", "#latency:0.3")
        page.fill("#input", "Tell me a long story about the sea and its many waves")
        page.click("#send")
        page.wait_for_selector(".msg.assistant[data-chunks]")
        page.click("#stop")
        assert page.is_hidden("#stop")
        assert page.locator(".msg.assistant[data-done=true]").count() == 0
        assert "Stopped" in page.inner_text(".msg.assistant")
        assert problems.items == []
    finally:
        page.close()


def test_attachments_push_to_talk_and_a_new_voice(
    browser, scripted_server: Server, tmp_path: Path
) -> None:
    page = browser.new_page()
    problems = watch(page)
    try:
        page.goto(scripted_server.http + "/turnbased")
        page.wait_for_selector("body[data-ready]", state="attached")

        # A voice uploaded through the picker is stored, chosen, and used by id.
        voice = spoken_wav(tmp_path / "my-voice.wav", "This is how I sound.", silence_s=0.2)
        page.set_input_files("#voice input[type=file]", str(voice))
        page.wait_for_selector("#voice option[value^='id:']:checked", state="attached")
        assert "my-voice" in page.inner_text("#voice select")

        # An image attachment shows as a chip until it is sent with the text.
        image = tmp_path / "dot.png"
        image.write_bytes(png())
        page.set_input_files("#file", str(image))
        page.wait_for_selector("#attachments .chip.image")
        page.fill("#input", "What is in this picture?")
        page.click("#send")
        answer = page.locator(".msg.assistant[data-done=true]").first
        answer.wait_for()
        text = answer.locator(".text").inner_text()
        assert "[image" in text and "What is in this picture?" in text, text
        assert "(voice:" in text, "the stored voice did not reach the engine"
        assert page.is_hidden("#attachments")

        # Push-to-talk: hold the button while speaking (the fake microphone), release to send.
        page.hover("#talk")
        page.mouse.down()
        page.wait_for_timeout(1500)
        page.mouse.up()
        second = page.locator(".msg.assistant[data-done=true]").nth(1)
        second.wait_for()
        assert "[audio" in second.inner_text(), second.inner_text()
        screenshot(page, "turnbased-attachments")
        assert problems.items == []
    finally:
        page.close()
