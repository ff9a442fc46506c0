"""The admin page's live samples: windows of units per worker, closed by the sampler."""

from __future__ import annotations

import asyncio

from omnilive.gateway.live_stats import (
    MAX_UNITS_PER_WINDOW,
    LiveStats,
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
