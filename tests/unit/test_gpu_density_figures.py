"""The density benchmark's headline figure, from its runs (no GPU needed)."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_density import largest_realtime


def level(p95: float, dropped: int = 0) -> dict[str, Any]:
    return {"latency_ms": {"p95": p95}, "dropped_chunks": dropped}


def test_the_largest_real_time_level_needs_every_smaller_one_real_time() -> None:
    runs = {"1": level(300), "8": level(490), "12": level(1259), "16": level(844)}
    assert largest_realtime(runs) == 8  # 16 passed after 12 failed: not 16
    runs["12"] = level(667)
    assert largest_realtime(runs) == 16


def test_a_dropped_chunk_or_a_missing_p95_is_not_real_time() -> None:
    assert largest_realtime({"1": level(200), "4": level(400, dropped=1)}) == 1
    assert largest_realtime({"1": {"latency_ms": {}, "dropped_chunks": 0}}) == 0
    assert largest_realtime({}) == 0
