"""Text appended into a MiniCPM-o duplex context between two units (the
Live API's instructions, thinking and commentary), on a tiny checkpoint
with the model's own code: written as the chat template writes a system
turn, it changes what the model decides next, and the slot session (the
batched engine) writes and counts it exactly as the model code's path does,
its window included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnilive.engines.appends import ContextNote, NoteKind
from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code
UNITS = 6
APPEND_AT = 3  # the note goes in after unit 2's finalize, before unit 3
NOTE = ContextNote(NoteKind.COMMENTARY, "Your table for two is booked at eight.")


def reference_run(duplex: Any, inputs: Any, voice: np.ndarray, wav: str, ids: list[int] | None):
    """The model code's duplex object: (kv length, first logits) per unit."""
    import torch

    from omnilive.engines.minicpmo.reference.duplex import feed_between_units

    seen: list[Any] = []
    decode = duplex.decoder.decode

    def record(logits: Any, **kwargs: Any) -> Any:
        seen.append(logits[0].detach().float().cpu())
        return decode(logits=logits, **kwargs)

    duplex.decoder.decode = record
    trace = []
    try:
        duplex.model.reset_session(reset_token2wav_cache=True)
        duplex.prepare(prefix_system_prompt=inputs.prompt, ref_audio=voice, prompt_wav_path=wav)
        for u, audio in enumerate(inputs.audio[:UNITS]):
            if u == APPEND_AT and ids is not None:
                feed_between_units(duplex, ids)
            duplex.streaming_prefill(audio_waveform=audio, frame_list=None, max_slice_nums=1)
            seen.clear()
            with torch.no_grad():
                duplex.streaming_generate(decode_mode="greedy", max_new_speak_tokens_per_chunk=8)
            if getattr(duplex, "_pending_finalize", None) is not None:
                duplex.finalize_unit()
            trace.append((int(duplex.decoder.get_cache_length()), seen[0] if seen else None))
    finally:
        duplex.decoder.decode = decode
    return trace


async def slot_run(duplex: Any, inputs: Any, voice: np.ndarray, ids: list[int] | None):
    from omnilive.engines.minicpmo.sessions.duplex.session import SlotDuplex
    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.sampling import SpeechSampling, TextSampling
    from omnilive.engines.minicpmo.sessions.shared import SharedModel, slot_loop

    shared = SharedModel.of_duplex(duplex, UnitRules())
    loop = slot_loop(duplex.model, 1, 4096)
    try:
        slot = await loop.acquire()
        session = SlotDuplex(
            shared, loop, slot, text=TextSampling(greedy=True),
            speech=SpeechSampling(temperature=0.0), seed=0, max_speak_tokens=8, keep_logits=True,
        )  # fmt: skip
        await session.prepare(inputs.prompt, None, voice, voice)
        trace = []
        for u, audio in enumerate(inputs.audio[:UNITS]):
            if u == APPEND_AT and ids is not None:
                assert session.append(ids) == len(ids)
            _, outcome = await session.unit(audio, None, force_listen=u < 1)
            await session.finalize()
            trace.append((session.kv_length, outcome.logits[0] if outcome.logits else None))
        await loop.release(slot)
        return trace
    finally:
        loop.close()


@pytest.fixture(scope="module")
def standalone(tiny_checkpoint: Path) -> Any:
    from benchmarks.duplex_equality import load_reference, load_voice, session_inputs

    duplex = load_reference(tiny_checkpoint, "standalone", "cpu", "float32", 8, 1)
    voice = load_voice(tiny_checkpoint / "voice.wav")
    return duplex, session_inputs(1, UNITS)[0], voice, str(tiny_checkpoint / "voice.wav")


def test_a_note_is_a_system_turn_of_the_chat_template(standalone: Any) -> None:
    from omnilive.engines.minicpmo.appends import note_ids, note_text

    duplex = standalone[0]
    text = note_text(duplex.tokenizer, NOTE)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n")
    assert "booked at eight" in text
    ids = note_ids(duplex.tokenizer, NOTE)
    assert ids[0] == duplex.tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_the_slot_session_writes_a_note_as_the_model_code_does(standalone: Any) -> None:
    from omnilive.engines.minicpmo.appends import note_ids

    duplex, inputs, voice, wav = standalone
    ids = note_ids(duplex.tokenizer, NOTE)
    import torch

    torch.manual_seed(0)
    plain = reference_run(duplex, inputs, voice, wav, None)
    noted = reference_run(duplex, inputs, voice, wav, ids)
    slotted = asyncio.run(slot_run(duplex, inputs, voice, ids))
    # The note is in the context from the unit after it on, in both paths.
    assert noted[APPEND_AT][0] - plain[APPEND_AT][0] == len(ids)
    assert [kv for kv, _ in slotted] == [kv for kv, _ in noted]
    # ...and the model's next decision reads it.
    assert not torch.allclose(noted[APPEND_AT][1], plain[APPEND_AT][1], atol=1e-4)
    for (_, mine), (_, theirs) in zip(slotted, noted, strict=True):
        if mine is not None and theirs is not None:
            assert float((mine - theirs).abs().max()) < 1e-3
