"""Turn-taking by meaning (issue 34): the Smart Turn v3 model on spoken turns,
and half-duplex sessions whose turns it ends before the silence rule would.

The turns are spoken by the cascade's Piper voice; a turn "with a pause" is
a sentence spoken with a comma where the speaker stops, cut at that pause.
"""

from __future__ import annotations

import asyncio

import numpy as np

from omnilive.end_of_turn import SmartTurn
from tests.clients import open_client
from tests.servers import Server
from tests.speech import chunks_b64, longest_pause, silence, speak_piper

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


async def turn_ends(server: Server, speech: np.ndarray, wait_s: float = 4.0) -> bool:
    """Whether a half-duplex turn of ``speech`` followed by 0.5 s of silence
    ends; no audio comes after it, so the 800 ms silence rule alone never
    ends it."""
    client = await open_client(server)
    await client.prepare("Be brief.", config={"vad": {"min_silence_duration_ms": 800}})
    audio = np.concatenate([silence(0.6), speech, silence(0.5)])
    for chunk in chunks_b64(audio, seconds=0.1):
        await client.send({"type": "audio_chunk", "audio_base64": chunk})
        await asyncio.sleep(0.01)
    try:
        await client.until("generating", timeout=wait_s)
    except TimeoutError:
        return False
    return True


async def test_a_finished_turn_is_answered_before_the_silence_rule(server):
    assert await turn_ends(server, speak_piper(COMPLETE))


async def test_a_paused_turn_waits_for_the_silence_rule(server):
    assert not await turn_ends(server, up_to_the_pause(speak_piper(PAUSED)))
