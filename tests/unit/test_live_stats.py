"""The admin page's live samples: windows of units per worker, closed by the sampler."""

from __future__ import annotations

import asyncio

from omnilive.gateway.live_stats import (
    MAX_UNITS_PER_WINDOW,
    LiveStats,
    SessionContext,
    WorkerSlots,
    percentile,
    sample_periodically,
)
from omnilive.gateway.metrics import GatewayMetrics
from omnilive.gateway.observe import SessionObserver
from omnilive.protocol.internal import Envelope


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([300.0], 95) == 300.0
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95)) == (50.0, 95.0)


def test_a_sample_closes_each_workers_window():
    stats = LiveStats()
    for ms in (200.0, 400.0, 900.0):
        stats.unit("w0", ms, 0)
    stats.unit("w0", None, 2)  # a listening unit that only reports drops
    stats.unit("w1", 1500.0, 1)
    first = stats.sample(10.0, 3, 4.5, [WorkerSlots("w0", 2, 8), WorkerSlots("w1", 1, 8)])
    assert (first.queue_length, first.queue_wait_s) == (3, 4.5)
    w0, w1 = first.workers["w0"], first.workers["w1"]
    assert (w0.slots_busy, w0.slots, w0.units, w0.dropped) == (2, 8, 3, 2)
    assert (w0.p50_ms, w0.p95_ms) == (400.0, 900.0)
    assert (w1.p50_ms, w1.dropped) == (1500.0, 1)
    # The next sample starts from an empty window: no units, no latency.
    second = stats.sample(12.0, 0, 0.0, [WorkerSlots("w0", 0, 8)])
    assert second.workers["w0"].units == 0
    assert second.workers["w0"].p50_ms is None
    assert list(second.workers) == ["w0"]  # a worker gone is no longer shown


def test_the_ring_and_the_windows_are_bounded():
    stats = LiveStats(keep=3)
    for t in range(5):
        stats.sample(float(t), 0, 0.0, [])
    assert [s.t for s in stats.samples] == [2.0, 3.0, 4.0]
    for ms in range(MAX_UNITS_PER_WINDOW + 10):
        stats.unit("w0", float(ms), 0)
    sample = stats.sample(5.0, 0, 0.0, [WorkerSlots("w0", 1, 1)])
    assert sample.workers["w0"].units == MAX_UNITS_PER_WINDOW + 10
    assert sample.workers["w0"].p50_ms >= 10.0  # the oldest latencies were dropped


def test_to_json_is_what_the_page_reads():
    stats = LiveStats(period_s=2.0)
    stats.unit("w0", 250.0, 0)
    stats.sample(1.0, 1, 2.0, [WorkerSlots("w0", 1, 4)])
    data = stats.to_json()
    assert data["period_s"] == 2.0
    [sample] = data["samples"]
    assert sample["workers"]["w0"] == {
        "slots_busy": 1,
        "slots": 4,
        "units": 1,
        "p50_ms": 250.0,
        "p95_ms": 250.0,
        "dropped": 0,
    }


def test_an_observer_counts_units_for_its_worker_once_leased():
    metrics = GatewayMetrics()
    watch = SessionObserver("duplex", metrics)
    result = Envelope("result", wall_clock_ms=300.0, unit_index=0, dropped_chunks=1)
    watch.relayed(result)  # not leased yet (cannot happen, but must not count)
    watch.worker_id = "w3"
    watch.relayed(Envelope("result", wall_clock_ms=600.0, unit_index=1, dropped_chunks=2))
    watch.relayed(Envelope("result", wall_clock_ms=600.0, unit_index=1))  # the same unit again
    sample = metrics.live.sample(1.0, 0, 0.0, [WorkerSlots("w3", 1, 8)])
    assert (sample.workers["w3"].units, sample.workers["w3"].dropped) == (1, 2)
    assert sample.workers["w3"].p50_ms == 600.0


def test_contexts_are_the_last_news_of_each_session_until_forgotten():
    stats = LiveStats()
    stats.context("dx_b", SessionContext("w1", 100, 8192, 0, 1.0))
    stats.context("dx_a", SessionContext("w1", 500, 8192, 0, 1.0))
    stats.context("dx_a", SessionContext("w1", 1000, 8192, 4, 2.0))  # a later unit replaces it
    stats.context("dx_c", SessionContext("w0", 40, None, 0, 2.0))  # no capacity: no fill
    assert stats.to_json()["contexts"] == [
        {"session_id": "dx_c", "worker_id": "w0", "kv_cache_length": 40,
         "context_capacity": None, "evicted_units": 0, "fill": None},
        {"session_id": "dx_a", "worker_id": "w1", "kv_cache_length": 1000,
         "context_capacity": 8192, "evicted_units": 4, "fill": 0.122},
        {"session_id": "dx_b", "worker_id": "w1", "kv_cache_length": 100,
         "context_capacity": 8192, "evicted_units": 0, "fill": 0.012},
    ]  # fmt: skip
    stats.forget("dx_a")
    stats.forget("dx_a")  # twice, or never reported: nothing to do
    stats.forget("never")
    assert [c["session_id"] for c in stats.contexts()] == ["dx_c", "dx_b"]


def test_the_contexts_are_capped_the_longest_without_news_out_first():
    stats = LiveStats(max_contexts=3)
    for n in range(3):
        stats.context(f"s{n}", SessionContext("w0", n, 10, 0, float(n)))
    stats.context("s0", SessionContext("w0", 5, 10, 0, 3.0))  # s0 has news: s1 is the oldest
    stats.context("s3", SessionContext("w0", 1, 10, 0, 4.0))
    assert [c["session_id"] for c in stats.contexts()] == ["s0", "s2", "s3"]
    for n in range(100):
        stats.context(f"x{n}", SessionContext("w0", 1, 10, 0, 5.0))
    assert len(stats.contexts()) == 3


def test_an_observer_reports_its_sessions_context_and_forgets_it_at_the_end():
    metrics = GatewayMetrics()
    watch = SessionObserver("duplex", metrics, wall_clock=lambda: 7.0)
    unit = Envelope("result", unit_index=0, kv_cache_length=300, context_capacity=1000)
    watch.relayed(unit)  # not leased yet: no session to show it under
    assert metrics.live.contexts() == []
    watch.worker_id, watch.session_id = "w2", "dx_1"
    watch.relayed(Envelope("result", unit_index=1, kv_cache_length=450, context_capacity=1000,
                           evicted_units=2))  # fmt: skip
    watch.relayed(Envelope("queue_update"))  # not a unit: the context stays as it was
    [shown] = metrics.live.contexts()
    assert shown == {"session_id": "dx_1", "worker_id": "w2", "kv_cache_length": 450,
                     "context_capacity": 1000, "evicted_units": 2, "fill": 0.45}  # fmt: skip
    assert metrics.live._contexts["dx_1"].updated_at == 7.0
    # The connection's next session takes the first one's place.
    watch.session_id = "dx_2"
    watch.relayed(Envelope("result", unit_index=0, kv_cache_length=10, context_capacity=1000))
    assert [c["session_id"] for c in metrics.live.contexts()] == ["dx_2"]
    watch.ended()
    watch.ended()
    assert metrics.live.contexts() == []


async def test_the_sampler_reads_the_gateway_every_period():
    stats = LiveStats(period_s=0.01)
    three = asyncio.Event()
    reads = []

    def read():
        reads.append(len(reads))
        if len(reads) == 3:
            three.set()
        return len(reads), 0.5, [WorkerSlots("w0", 1, 2)]

    async with asyncio.timeout(5), asyncio.TaskGroup() as tasks:
        sampler = tasks.create_task(sample_periodically(stats, read, clock=lambda: 42.0))
        await three.wait()  # the third sample is taken as soon as read() returns
        sampler.cancel()
    assert [s.queue_length for s in list(stats.samples)[:3]] == [1, 2, 3]
    assert stats.samples[0].t == 42.0
