"""How many sessions one GPU takes: the minicpmo engine's slot sizing, and a
worker whose engine learns its slot count only when loaded."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest

from omnilive.config import load_settings
from omnilive.engines.base import EngineUnavailable
from omnilive.engines.minicpmo.sessions.views import (
    SESSION_WORKING_BYTES,
    SPEECH_CAPACITY,
    kv_bytes_per_position,
    plan_slots,
)
from omnilive.engines.scripted import ScriptedEngine
from omnilive.worker.runtime import WorkerRuntime

GIB = 2**30
# Qwen3-8B, the LLM of MiniCPM-o 4.5: 36 layers, 8 KV heads of 128.
QWEN3_8B = SimpleNamespace(
    num_hidden_layers=36, num_key_value_heads=8, head_dim=128, hidden_size=4096,
    num_attention_heads=32,
)  # fmt: skip


def test_a_position_of_the_llm_context_takes_144_kib_in_bf16() -> None:
    assert kv_bytes_per_position(QWEN3_8B, 2) == 2 * 36 * 8 * 128 * 2 == 147_456
    # 8192 positions per slot: 1.125 GiB, what docs/design/gpu-engine.md quotes.
    assert kv_bytes_per_position(QWEN3_8B, 2) * 8192 == int(1.125 * GIB)


def test_head_dim_defaults_to_hidden_over_attention_heads() -> None:
    config = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, hidden_size=64,
                             num_attention_heads=4)  # fmt: skip
    assert kv_bytes_per_position(config, 4) == 2 * 2 * 2 * 16 * 4


def test_unset_slots_take_as_many_as_fit_up_to_the_cap() -> None:
    per_slot = 2 * GIB
    assert plan_slots(60 * GIB, 4 * GIB, per_slot, None, cap=16) == 16
    assert plan_slots(25 * GIB, 4 * GIB, per_slot, None, cap=16) == 10
    assert plan_slots(7 * GIB, 4 * GIB, per_slot, None, cap=16) == 1


def test_asked_slots_are_given_when_they_fit() -> None:
    assert plan_slots(60 * GIB, 4 * GIB, 2 * GIB, 20, cap=16) == 20  # the cap is for unset


@pytest.mark.parametrize(
    ("free_gib", "requested", "fits"),
    [(5, 4, 0), (9, 4, 2), (3, 1, 0), (5, None, 0)],  # unset: even one slot must fit
)
def test_what_does_not_fit_is_refused_with_the_numbers(
    free_gib: int, requested: int | None, fits: int
) -> None:
    with pytest.raises(EngineUnavailable) as refused:
        plan_slots(free_gib * GIB, 4 * GIB, 2 * GIB, requested, cap=16)
    message = str(refused.value)
    assert f"{free_gib:.1f} GiB are free: {fits} fit" in message
    assert "minicpmo.slots" in message


def test_the_working_set_and_speech_context_are_counted() -> None:
    assert SESSION_WORKING_BYTES > 0 and SPEECH_CAPACITY >= 2048


class GrowingEngine(ScriptedEngine):
    """The scripted engine, with three slots known only once loaded."""

    def load(self, progress) -> None:
        super().load(progress)
        self.capabilities = dataclasses.replace(self.capabilities, slots=3)


async def test_a_worker_serves_as_many_sessions_as_its_engine_has_slots_once_loaded() -> None:
    engine = GrowingEngine(load_settings(environ={}).scripted)
    assert engine.capabilities.slots == 1
    runtime = WorkerRuntime(engine, "w0")
    try:
        await runtime.load()
        assert runtime.status().slots == 3
        async with (
            runtime.session("a", "chat"),
            runtime.session("b", "chat"),
            asyncio.timeout(5),  # a fourth slot would hang here
            runtime.session("c", "chat") as third,
        ):
            assert await runtime.step(third.lane.run, lambda: 42) == 42
            assert len(runtime.status().sessions) == 3
    finally:
        runtime.close()
