"""``omnilive talk`` as a user runs it, through files, against a real server
(scripted engine): every mode, Ctrl-C, and the refusals it explains."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnilive.client.audio import OUTPUT_RATE, load_wav, read_wav_file, write_wav
from tests.client.helpers import Talked, talk
from tests.servers import Server, free_port
from tests.speech import silence, speak


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("talk") / "q.wav"
    write_wav(path, speak("What is the weather like in Paris?"), 16000)
    return path


def speech_in(path: Path) -> float:
    """Seconds of the model's speech in an output file (it must be audible)."""
    audio, rate = read_wav_file(path)
    assert rate == OUTPUT_RATE and np.abs(audio).max(initial=0.0) > 0.05
    return audio.size / rate


async def test_half_duplex_through_files(scripted: Server, question: Path, tmp_path: Path):
    answer = tmp_path / "a.wav"
    done = await talk("--url", scripted.http, "--input", str(question), "--output", str(answer))
    assert done.code == 0, done.err
    lines = done.out.splitlines()
    assert lines[0].startswith("connected: half_duplex session hd_")
    assert "[hearing you]" in lines and "[heard you]" in lines
    said = next(line for line in lines if line.startswith("AI: "))
    assert said.startswith("AI: Turn 0: heard")
    latency = next(line for line in lines if line.startswith("latency: "))
    # From the end of the voice, not from the server's decision that it ended:
    # at least the silence the server waits for (200 ms before its first judgement).
    assert float(latency.split()[1]) > 0.15, lines
    assert lines[-2] == "session ended: stopped"
    assert speech_in(answer) > 1.0


async def test_duplex_and_omni_through_files(scripted: Server, question: Path, tmp_path: Path):
    frame = tmp_path / "camera.jpg"
    Image.new("RGB", (32, 32), (0, 90, 40)).save(frame, "JPEG")

    async def duplex(mode: str) -> tuple[Talked, Path]:
        answer = tmp_path / f"{mode}.wav"
        args = ["--url", scripted.http, "--mode", mode, "--system", "#schedule:LSE"]
        args += ["--input", str(question), "--output", str(answer), "--frame", str(frame)]
        return await talk(*args), answer

    for mode, (done, answer) in zip(
        ["duplex", "omni"], await asyncio.gather(duplex("duplex"), duplex("omni")), strict=True
    ):
        assert done.code == 0, done.err
        said = next(line for line in done.out.splitlines() if line.startswith("AI: "))
        assert ("frames 1" in said) == (mode == "omni")  # the still frame rides with each unit
        assert "session ended: stopped" in done.out
        assert speech_in(answer) > 1.0


async def test_chat_through_files(scripted: Server, question: Path, tmp_path: Path):
    answer = tmp_path / "a.wav"
    args = ["--url", scripted.http, "--mode", "chat", "--system", "Be brief."]
    done = await talk(*args, "--input", str(question), "--output", str(answer))
    assert done.code == 0, done.err
    heard = load_wav(question).size / 16000
    assert f"AI: You said: [audio {heard:.2f} s]" in done.out
    assert "session ended: done" in done.out
    assert speech_in(answer) > 0.5


async def test_ctrl_c_stops_the_session_on_the_server(scripted: Server, tmp_path: Path):
    long_input = tmp_path / "long.wav"
    write_wav(long_input, np.concatenate([speak("Hello there."), silence(30.0)]), 16000)
    answer = tmp_path / "a.wav"
    args = ["--url", scripted.http, "--input", str(long_input), "--output", str(answer)]
    done = await talk(*args, interrupt_after="[hearing you]")
    assert done.code == 0, done.err
    # "stopped" is the server's answer to the stop the client sent on its way out
    assert "session ended: stopped (Ctrl-C)" in done.out
    assert answer.exists()


async def test_refusals_and_missing_devices_are_one_line(tmp_path: Path, question: Path):
    nobody = f"http://127.0.0.1:{free_port()}"
    refused = await talk("--url", nobody, "--input", str(question), "--output", "/dev/null")
    assert refused.code == 3 and refused.err.startswith("omnilive talk: connection_failed: ")
    assert len(refused.err.strip().splitlines()) == 1
    missing = await talk("--url", nobody, "--input", str(tmp_path / "nothing.wav"))
    assert missing.code == 2 and "no such file" in missing.err
    if importlib.util.find_spec("sounddevice") is None:
        devices = await talk("--url", nobody)
        assert devices.code == 2 and len(devices.err.strip().splitlines()) == 1
        assert "pip install 'omnilive[talk]'" in devices.err and "--input" in devices.err


def test_the_voice_ends_at_its_last_loud_frame():
    from omnilive.client.talk_modes import voice_ended_at

    block = np.zeros(8000, np.float32)  # 0.5 s, sent at t = 10
    assert voice_ended_at(block, 10.0) is None
    block[:3680] = 0.3  # voiced for 0.23 s
    assert voice_ended_at(block, 10.0) == pytest.approx(10.0 - 0.27, abs=0.011)
