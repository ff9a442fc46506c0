"""``omnilive talk`` with a microphone and a speaker, against a real server
(scripted engine). The audio devices are stood in for (``fake_sounddevice``:
threads calling the callbacks in real time, as PortAudio does); everything
from the callbacks on is the real path: the microphone's hand-over to the
event loop, the echo guard, the speaker's queue, Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import sys
from collections.abc import Callable

import numpy as np
import pytest

from omnilive.client import talk
from tests.client import fake_sounddevice
from tests.client.fake_sounddevice import PLAYED
from tests.servers import Server
from tests.speech import silence, speak


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sounddevice)
    fake_sounddevice.HEARD.clear()
    fake_sounddevice.PLAYED.clear()


async def talk_until(
    out: io.StringIO, *argv: str, until: Callable[[str], bool], timeout: float = 30
) -> None:
    """Run ``omnilive talk`` in this process until ``until(screen)``, then Ctrl-C."""
    parser = argparse.ArgumentParser()
    talk.add_arguments(parser)
    running = asyncio.create_task(talk.talk(parser.parse_args(argv), out), name="talk")
    try:
        async with asyncio.timeout(timeout):
            while not until(out.getvalue()):
                await asyncio.wait([running], timeout=0.05)
                assert not running.done(), out.getvalue()
    finally:
        running.cancel()  # what Ctrl-C does to asyncio.run's task
        with pytest.raises(asyncio.CancelledError):
            await running
    assert "session ended: stopped (Ctrl-C)" in out.getvalue(), out.getvalue()


@pytest.mark.usefixtures("devices")
async def test_half_duplex_hears_the_microphone_and_plays_the_answer(scripted: Server):
    fake_sounddevice.HEARD[:] = [silence(0.5), speak("What is the weather like?"), silence(1.5)]
    out = io.StringIO()

    def played(screen: str) -> bool:
        return "latency:" in screen and any(np.abs(p).max() > 0.05 for p in PLAYED)

    await talk_until(out, "--url", scripted.http, until=played)
    screen = out.getvalue()
    assert "[hearing you]" in screen and "AI: Turn 0: heard" in screen
    assert np.isfinite(np.concatenate(PLAYED)).all(), "the speaker's callback fills every sample"


@pytest.mark.usefixtures("devices")
async def test_duplex_holds_the_microphone_while_the_answer_plays(scripted: Server):
    fake_sounddevice.HEARD[:] = [np.full(16000 * 12, 0.05, np.float32)]  # a steady voice
    out = io.StringIO()
    argv = ["--url", scripted.http, "--mode", "duplex", "--system", "#schedule:LSSSSE"]
    await talk_until(out, *argv, until=lambda screen: "unit 4 rms" in screen)
    heard = {int(u): float(r) for u, r in re.findall(r"unit (\d+) rms ([0-9.]+)", out.getvalue())}
    assert heard[1] == pytest.approx(0.05, abs=0.002)  # before the model spoke
    assert heard[3] == 0.0 and heard[4] == 0.0  # while its speech played: held (no echo)
