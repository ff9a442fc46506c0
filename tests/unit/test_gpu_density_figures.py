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


def test_webrtc_units_are_timed_from_the_end_of_their_second_of_microphone_audio():
    """gpu_density_webrtc: the seconds before a call's first unit are read off
    its results (no unit's latency below its server time), so each unit's
    latency is from its own second's end, whatever the session's first unit was."""
    from benchmarks.gpu_density_webrtc import figures, unit_latencies

    mic_start, first = 100.0, 3  # three seconds of audio went before prepared
    transport = [0.04, 0.09, 0.05, 0.30, 0.045]  # what WebRTC adds, per unit
    server = [0.050, 0.400, 0.060, 0.500, 0.055]
    results = [
        {"type": "result", "unit_index": k, "wall_clock_ms": server[k] * 1000,
         "is_listen": k % 2 == 0, "dropped_chunks": 0,
         "arrived": mic_start + first + k + 1 + server[k] + transport[k]}
        for k in range(5)
    ]  # fmt: skip
    rows = unit_latencies(mic_start, results)
    assert [round(r["latency_ms"]) for r in rows] == [
        round((s + t) * 1000) for s, t in zip(server, transport, strict=True)
    ]
    assert [round(r["added_ms"]) for r in rows] == [round(t * 1000) for t in transport]
    # the figures leave out the warm-up units and count what never came
    call = {"units": rows, "sounded": True, "error": None}
    run = figures([call], units=6)
    assert run["latency_ms"]["n"] == 3 and run["dropped_chunks"] == 1
    assert not run["real_time"]
