# ruff: noqa: F811 - the test_slot_engine fixtures, imported, are requested by name
"""The encoders' start-up warm-up (``sessions/encoders/warm.py``): every
shape it runs twice (the second call is the one a ShapeGraphs captures) is a
shape real omni sessions then run, for one to as many units at once as
there are slots, so that no session waits behind a capture. On the CPU the
graphs are recorders around the eager encoders: the shapes are what is
checked."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from typing import Any

import numpy as np
from PIL import Image

from omnilive.engines.messages import DuplexOptions, UnitInput
from omnilive.engines.minicpmo.sessions.encoders import warm
from omnilive.engines.minicpmo.sessions.encoders.vision import encoder_layers
from omnilive.engines.minicpmo.sessions.encoders.whisper_batch import run_eagerly
from tests.minicpmo.test_slot_engine import engine, tiny  # noqa: F401 - the fixtures


class VisionShapes:
    """Stands for the vision encoder's BlockGraphs: counts each input shape."""

    def __init__(self, vpm: Any) -> None:
        self.layers = encoder_layers(vpm)
        self.calls: Counter[tuple] = Counter()

    def __call__(self, hidden: Any, *allowed: Any) -> Any:
        self.calls[(tuple(hidden.shape), bool(allowed))] += 1
        return self.layers(hidden, *allowed)


class WhisperShapes:
    """Stands for WhisperGraphs: counts each (features' shape, context)."""

    def __init__(self) -> None:
        self.calls: Counter[tuple] = Counter()

    def run(self, model: Any, features: Any, positions: Any, prefix: int, attend: Any) -> Any:
        self.calls[(tuple(features.shape), prefix)] += 1
        return run_eagerly(model, features, positions, prefix, attend)


def jpeg(size: tuple[int, int], seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


async def omni_units(engine: Any, sessions: int, units: int, size: tuple[int, int]) -> None:
    """``sessions`` omni sessions at once, each sending ``units`` seconds
    with a frame of ``size``: the encoders' lane gathers their units."""
    opened = [engine.open_duplex() for _ in range(sessions)]
    try:
        for index, session in enumerate(opened):
            await session.prepare(f"You are assistant {index}.", DuplexOptions(vision=True))
        rng = np.random.default_rng(5)
        for k in range(units):
            second = [rng.normal(0, 0.05, 16_000).astype(np.float32) for _ in opened]
            given = [UnitInput(audio, [jpeg(size, k)], None, True) for audio in second]
            await asyncio.gather(*(s.unit(u) for s, u in zip(opened, given, strict=True)))
            await asyncio.gather(*(s.finalize() for s in opened))
    finally:
        for session in opened:
            session.close()


async def test_the_warm_up_runs_the_shapes_sessions_then_run(engine: Any, monkeypatch) -> None:
    shared = engine._slots.shared
    vision, whisper = VisionShapes(shared.model.vpm), WhisperShapes()
    monkeypatch.setattr(shared, "vision_layers", lambda: vision)
    monkeypatch.setattr(shared, "audio_graphs", lambda: whisper)
    slots = engine._slots.batch.steps.cache.slots
    shapes = await engine._slots.batch.encoder_call(warm.warm_encoders, shared, slots)
    assert shapes == len(vision.calls) + len(whisper.calls)
    assert set(vision.calls.values()) == {2} and set(whisper.calls.values()) == {2}
    rows = {shape[0] for shape, _ in vision.calls}
    assert rows == set(range(1, min(slots, warm.WARM_ROWS) + 1))  # one frame a unit
    assert {prefix for _, prefix in whisper.calls} == {0, 2}  # first seconds and later ones
    warmed_vision, warmed_whisper = set(vision.calls), set(whisper.calls)
    vision.calls.clear()
    whisper.calls.clear()
    for sessions in (1, slots):
        await omni_units(engine, sessions, units=3, size=warm.WARM_FRAME_SIZES[0])
    assert vision.calls and whisper.calls
    assert set(vision.calls) <= warmed_vision, "a session ran a vision shape not warmed"
    assert set(whisper.calls) <= warmed_whisper, "a session ran a Whisper shape not warmed"
