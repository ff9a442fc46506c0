"""Turn-taking by meaning (issue 34): the Smart Turn v3 model on spoken turns,
and half-duplex sessions whose turns it ends before the silence rule would.

The turns are spoken by the cascade's Piper voice; a turn "with a pause" is
a sentence spoken with a comma where the speaker stops, cut at that pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from omnilive.audio import INPUT_RATE
from omnilive.end_of_turn import SmartTurn
from tests.clients import open_client
from tests.servers import Server, running
from tests.speech import chunks_b64, longest_pause, silence, speak_piper

pytestmark = pytest.mark.shared_server

COMPLETE = "Which animal is the largest on our planet?"
PAUSED = "So I was thinking, that we could go out."  # cut at the comma's pause


def up_to_the_pause(speech: np.ndarray) -> np.ndarray:
    start, end = longest_pause(speech)
    assert end - start >= 5 * 320, "the comma made no pause"
    return speech[:start]


def test_the_model_tells_a_finished_turn_from_a_paused_one():
    model = SmartTurn.load(None)
    tail = silence(0.2)
    finished = model.probability(np.concatenate([speak_piper(COMPLETE), tail]))
    paused = model.probability(np.concatenate([up_to_the_pause(speak_piper(PAUSED)), tail]))
    assert finished > 0.8 > 0.3 > paused, (finished, paused)


RULE = {"vad": {"min_silence_duration_ms": 800}}


async def turn_ends(server: Server, speech: np.ndarray, **how: Any) -> bool:
    """Whether a half-duplex turn of ``speech`` followed by ``silence_s`` of
    silence ends; no audio comes after it, so with 0.5 s the 800 ms silence
    rule alone never ends it. Pieces of 0.1 s go ``pace_s`` apart (0.1: as a
    microphone). ``config`` is the prepare's (None: the server's defaults)."""
    return await first_turn(server, speech, **how) is not None


async def first_turn(
    server: Server,
    speech: np.ndarray,
    wait_s: float = 4.0,
    pace_s: float = 0.01,
    silence_s: float = 0.5,
    config: dict | None = RULE,
    then: np.ndarray | None = None,
) -> dict | None:
    """The ``generating`` message of the first turn heard in ``speech``,
    ``silence_s`` of silence and ``then`` (more audio, the turn's rest), or
    None if none comes within ``wait_s`` of the last piece. The session
    ends then: the next turn's session would wait in the queue behind it
    until its inactivity timeout."""
    client = await open_client(server)
    try:
        await client.prepare("Be brief.", config=config)
        rest = [then] if then is not None else []
        audio = np.concatenate([silence(0.6), speech, silence(silence_s), *rest])
        for chunk in chunks_b64(audio, seconds=0.1):
            await client.send({"type": "audio_chunk", "audio_base64": chunk})
            await asyncio.sleep(pace_s)
        try:
            return await client.until("generating", timeout=wait_s)
        except TimeoutError:
            return None
    finally:
        await client.ws.close()


async def test_a_finished_turn_is_answered_before_the_silence_rule(server):
    assert await turn_ends(server, speak_piper(COMPLETE))


async def test_a_paused_turn_waits_for_the_silence_rule(server):
    assert not await turn_ends(server, up_to_the_pause(speak_piper(PAUSED)))


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # The defaults: unfinished words may wait 1.6 s where the client leaves
    # the rule to the server.
    with running(tmp_path_factory.mktemp("turns"), engine="cascade", ready_timeout=240) as server:
        yield server


@pytest.mark.cascade
async def test_on_the_cascade_words_cut_off_hold_a_turn_that_sounds_finished(cascade: Server):
    """Smart Turn finds this cut-off turn finished by its sound (0.92 and
    0.95 at 200 and 400 ms of silence: two agreeing verdicts); the cascade's
    language model, reading "The weather today is", does not (~0.002)."""
    cut_off = up_to_the_pause(speak_piper("The weather today is, really nice for a walk."))
    # At a microphone's pace: the words are judged by the answer begun at the pause.
    assert not await turn_ends(cascade, cut_off, pace_s=0.1)


@pytest.mark.cascade
async def test_on_the_cascade_a_finished_question_is_answered_before_the_rule(cascade: Server):
    question = speak_piper("What is the tallest mountain in the whole world?")
    assert await turn_ends(cascade, question, pace_s=0.1)


async def test_without_words_a_turn_left_to_the_server_ends_at_the_silence_rule(server):
    """The scripted engine judges no words: a client that sets no silence
    rule still has its paused turn ended at the spec's 800 ms, as before."""
    paused = up_to_the_pause(speak_piper(PAUSED))
    assert await turn_ends(server, paused, silence_s=1.0, config=None)


@pytest.mark.cascade
async def test_on_the_cascade_unfinished_words_wait_past_the_rule_the_client_left_open(
    cascade: Server,
):
    """A mid-sentence pause of 1.1 s: a client that set 800 ms has the turn
    cut there (its own rule is the longest wait); one that left the rule to
    the server, streaming as a microphone does, is waited for (up to
    end_of_turn.unfinished_wait_ms, 1.6 s): the turn is the whole sentence."""
    sentence = speak_piper("The weather today is, really nice for a walk.")
    start, end = longest_pause(sentence)
    cut_off, rest = sentence[:start], sentence[end:]
    assert await turn_ends(cascade, cut_off, pace_s=0.1, silence_s=1.1)
    then = np.concatenate([rest, silence(1.0)])
    whole = await first_turn(cascade, cut_off, 6.0, 0.1, 1.1, None, then)
    assert whole is not None
    # Cut at the pause, the turn's speech would be at most the words before it.
    assert whole["speech_duration_ms"] / 1000 > cut_off.size / INPUT_RATE + 0.8, whole


@pytest.mark.cascade
async def test_a_held_turn_ends_when_the_client_stops_sending_after_the_rule(cascade: Server):
    """The same pause, after which the client sends nothing more (a clip sent
    whole, a microphone turned off): the server stops waiting for more words
    (no chunk for the last one's length and 0.3 s) once the 800 ms the rule
    asks for are heard; with 0.5 s heard it still waits, as the rule does."""
    cut_off = up_to_the_pause(speak_piper("The weather today is, really nice for a walk."))
    ended = await first_turn(cascade, cut_off, pace_s=0.1, silence_s=1.1, config=None)
    assert ended is not None
    assert ended["speech_duration_ms"] / 1000 < cut_off.size / INPUT_RATE + 0.5, ended
    assert not await turn_ends(cascade, cut_off, pace_s=0.1, silence_s=0.5, config=None)
