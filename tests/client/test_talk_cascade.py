"""``omnilive talk`` on the real embedded engine (cascade): a question spoken
by espeak-ng goes in as a file, and the answer that comes out is speech that
Whisper transcribes back to the words the model said."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from omnilive.client.audio import load_wav, write_wav
from omnilive.engines.cascade.asr import WhisperASR
from tests.cascade.speech import overlap
from tests.client.helpers import talk
from tests.servers import Server, running
from tests.speech import speak

pytestmark = pytest.mark.cascade


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("cascade"), engine="cascade", ready_timeout=240) as server:
        yield server


async def test_a_spoken_question_gets_an_answer_whisper_understands(
    cascade: Server, tmp_path: Path
):
    question, answer = tmp_path / "q.wav", tmp_path / "a.wav"
    write_wav(question, speak("What is the capital of France?"), 16000)
    args = ["--url", cascade.http, "--system", "Answer in one short sentence."]
    done = await talk(*args, "--input", str(question), "--output", str(answer), timeout=120)
    assert done.code == 0, done.err
    said = next(line for line in done.out.splitlines() if line.startswith("AI: "))[4:]
    assert said.strip() and "session ended: stopped" in done.out
    # the server's own copy of Whisper (joined into its data dir when it loaded)
    whisper = WhisperASR(cascade.tmp / "data" / "cache" / "whisper-base", threads=2)
    whisper.load()
    heard = whisper.transcribe(load_wav(answer)).text
    # Half the words, not more: Piper draws noise for every rendering, and the
    # answer's two-word first piece ("Paris is," then "the capital of
    # France.") is heard as one word ("Erisis") in most renderings and with
    # "France" as "friends" too in about one in ten (0.5 in 4 of 80 of them,
    # 0.67 in 70, none under 0.5). Audio that is not this answer shares none.
    assert overlap(said, heard) >= 0.5, (said, heard)
