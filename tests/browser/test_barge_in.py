"""Barge-in over WebRTC in Chromium: the half-duplex page keeps its
echo-cancelled microphone open during the answer, and a second question
spoken over the first answer stops it and is answered in turn. (A module of
its own: Chromium's fake microphone plays one file per browser, and one
browser a module.)"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.browser.harness import chromium, settle_transport, watch
from tests.browser.test_webrtc import wait_no_calls
from tests.servers import Server


@pytest.fixture(scope="module")
def speaks_over_answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A browser whose microphone asks a question, then, a moment into the
    answer, asks another one over it."""
    from omnilive.audio import wav_bytes
    from tests.speech import silence, speak

    tmp = tmp_path_factory.mktemp("webrtc_barge_in")
    audio = np.concatenate([
        silence(1.0), speak("What is the capital of France?"), silence(1.2),
        speak("No wait, tell me about Rome instead."), silence(5.0),
    ])  # fmt: skip
    wav = tmp / "two_questions.wav"
    wav.write_bytes(wav_bytes(audio, 16000))
    with chromium(tmp, [f"--use-file-for-fake-audio-capture={wav}"]) as context:
        yield context


def test_half_duplex_over_webrtc_the_user_can_speak_over_the_answer(
    speaks_over_answers, scripted_server: Server
) -> None:
    page = speaks_over_answers.new_page()
    problems = watch(page)
    try:
        page.goto(scripted_server.http + "/half_duplex")
        page.wait_for_selector("body[data-ready]", state="attached")
        page.fill("#system-prompt", "#latency:0.5 Answer slowly.")  # still answering at the 2nd
        page.click("#start")
        settle_transport(page, scripted_server)
        # The second question, heard through the echo-cancelled microphone
        # while the first answer is made, stops it and is answered in turn.
        page.wait_for_selector("#transcript .turn.ai[data-interrupted]", timeout=40_000)
        page.wait_for_selector("#transcript .turn.ai[data-done]", timeout=40_000)
        users = page.locator("#transcript .turn.user")
        assert users.count() >= 2
        assert not page.is_visible("#notice.error")
        page.click("#stop")
        wait_no_calls(page, scripted_server)
        assert problems.items == []
    finally:
        page.close()
