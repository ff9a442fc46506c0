"""The pool's scheduling core, without I/O: FIFO, capacity, cancel, positions, ETA."""

from __future__ import annotations

import random

import pytest

from omnilive.config import EtaSettings
from omnilive.gateway.eta import EtaModel
from omnilive.gateway.scheduler import (
    NoWorkersError,
    QueueFullError,
    Scheduler,
    WorkerHealth,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(workers: int = 1, slots: int = 1, max_queue: int = 1000, **eta: float):
    clock = Clock()
    scheduler = Scheduler(EtaModel(EtaSettings(**eta)), max_queue, clock)
    for i in range(workers):
        scheduler.add_worker(f"w{i}", f"http://w{i}")
        scheduler.set_worker_state(f"w{i}", WorkerHealth.READY, slots=slots)
    return scheduler, clock


def test_idle_worker_is_assigned_at_once_and_marked_busy():
    scheduler, _ = make()
    first = scheduler.submit("chat", "s1")
    second = scheduler.submit("chat", "s2")
    assert first.lease is not None and first.lease.worker_id == "w0"
    assert second.lease is None
    assert scheduler.position(second.ticket_id) == 1


def test_fifo_order_on_release():
    scheduler, _ = make()
    running = scheduler.submit("chat", "s0")
    waiting = [scheduler.submit("chat", f"s{i}") for i in range(1, 5)]
    served = []
    lease = running.lease
    for _ in waiting:
        assigned = scheduler.release(lease)
        assert len(assigned) == 1
        served.append(assigned[0].session_id)
        lease = assigned[0].lease
    assert served == ["s1", "s2", "s3", "s4"]


def test_capacity_limit_rejects_when_full():
    scheduler, _ = make(max_queue=2)
    scheduler.submit("chat", "running")
    scheduler.submit("chat", "a")
    scheduler.submit("chat", "b")
    with pytest.raises(QueueFullError):
        scheduler.submit("chat", "c")


def test_no_workers_at_all_is_refused():
    scheduler = Scheduler(EtaModel(EtaSettings()), 10, Clock())
    with pytest.raises(NoWorkersError):
        scheduler.submit("chat", "s")


def test_cancel_keeps_positions_contiguous():
    scheduler, _ = make()
    scheduler.submit("chat", "running")
    tickets = [scheduler.submit("chat", f"s{i}") for i in range(4)]
    removed, _ = scheduler.cancel(tickets[1].ticket_id)
    assert removed
    assert [scheduler.position(t.ticket_id) for t in tickets] == [1, None, 2, 3]
    assert scheduler.cancel(tickets[1].ticket_id)[0] is False


def test_slots_are_leased_individually():
    scheduler, _ = make(workers=1, slots=2)
    a, b, c = (scheduler.submit("chat", s) for s in "abc")
    assert a.lease and b.lease and c.lease is None
    assert a.lease.lease_id != b.lease.lease_id
    assert scheduler.release(a.lease)[0] is c


def test_offline_worker_is_never_assigned_and_comes_back_empty():
    scheduler, _ = make(workers=1)
    running = scheduler.submit("chat", "a")
    scheduler.set_worker_state("w0", WorkerHealth.OFFLINE)
    waiting = scheduler.submit("chat", "b")
    assert waiting.lease is None
    # A late release for the dead process must not free anything twice.
    assert scheduler.release(running.lease) == []
    assigned = scheduler.set_worker_state("w0", WorkerHealth.READY)
    assert assigned == [waiting]


def test_loading_worker_is_not_assigned():
    scheduler, _ = make(workers=0)
    scheduler.add_worker("w0", "http://w0")
    scheduler.set_worker_state("w0", WorkerHealth.LOADING)
    ticket = scheduler.submit("chat", "a")
    assert ticket.lease is None
    assert scheduler.set_worker_state("w0", WorkerHealth.READY) == [ticket]


def test_eta_walks_queue_over_earliest_free_slot():
    scheduler, clock = make(workers=2, chat_s=10, half_duplex_s=100)
    scheduler.submit("half_duplex", "a")  # w0 busy 100 s
    clock.now += 4
    scheduler.submit("chat", "b")  # w1 busy 10 s from now
    c = scheduler.submit("chat", "c")
    d = scheduler.submit("half_duplex", "d")
    e = scheduler.submit("chat", "e")
    waits = scheduler.estimates()
    # free at: w1 → 10, w0 → 96. c takes w1 at 10 (then 20), d takes 20 (then 120),
    # e takes w0 at 96.
    assert waits[c.ticket_id] == pytest.approx(10)
    assert waits[d.ticket_id] == pytest.approx(20)
    assert waits[e.ticket_id] == pytest.approx(96)


def test_eta_overrun_floor():
    scheduler, clock = make(workers=1, chat_s=10, overrun_floor_s=15)
    scheduler.submit("chat", "a")
    waiting = scheduler.submit("chat", "b")
    clock.now += 8
    assert scheduler.estimates()[waiting.ticket_id] == pytest.approx(2)
    clock.now += 30  # a is 28 s past its 10 s baseline
    assert scheduler.estimates()[waiting.ticket_id] == pytest.approx(15)


def test_ema_replaces_baseline_after_min_samples():
    eta = EtaModel(EtaSettings(chat_s=15, ema_alpha=0.3, ema_min_samples=3))
    eta.observe("chat", 10)
    eta.observe("chat", 20)
    assert eta.baseline("chat") == 15  # only two samples: configured baseline
    eta.observe("chat", 30)
    # EMA: 10 → 0.3·20 + 0.7·10 = 13 → 0.3·30 + 0.7·13 = 18.1
    assert eta.baseline("chat") == pytest.approx(18.1)
    assert eta.baseline("half_duplex") == 180


def test_release_feeds_eta_only_for_successful_sessions():
    scheduler, clock = make(ema_min_samples=1)
    for duration, ok in ((5, True), (50, False)):
        ticket = scheduler.submit("chat", "s")
        clock.now += duration
        scheduler.release(ticket.lease, ok=ok)
    assert scheduler.eta.baseline("chat") == pytest.approx(5)


def test_eta_update_changes_only_named_fields():
    eta = EtaModel(EtaSettings())
    eta.update({"chat_s": 42})
    assert eta.settings.chat_s == 42
    assert eta.settings.omni_duplex_s == 90
    assert eta.settings.ema_alpha == 0.3


def test_200_requests_on_3_workers_all_complete_with_contiguous_positions():
    rng = random.Random(7)
    scheduler, clock = make(workers=3)
    types = ["chat", "half_duplex", "audio_duplex", "omni_duplex"]
    pending = 200
    running: list[tuple[float, object]] = []  # (finish time, lease)
    completed = 0
    submitted = 0
    while completed < 200:
        # submit in bursts, release in order of finish time
        for _ in range(rng.randint(0, 5)):
            if submitted < pending:
                ticket = scheduler.submit(rng.choice(types), f"s{submitted}")
                submitted += 1
                if ticket.lease:
                    running.append((clock.now + rng.uniform(1, 50), ticket.lease))
        positions = [scheduler.position(t) for t in scheduler.queue]
        assert positions == list(range(1, len(scheduler.queue) + 1))
        waits = list(scheduler.estimates().values())
        assert waits == sorted(waits), "a later ticket never waits less"
        busy = sum(len(w.leases) for w in scheduler.workers.values())
        assert busy == len(running) <= 3
        if running:
            running.sort(key=lambda item: item[0])
            finish, lease = running.pop(0)
            clock.now = max(clock.now, finish)
            for ticket in scheduler.release(lease):
                running.append((clock.now + rng.uniform(1, 50), ticket.lease))
            completed += 1
        elif submitted == pending:
            break
    assert completed == 200
    assert not scheduler.queue


def test_capacity_counts_only_requests_that_wait():
    scheduler, _ = make(max_queue=0)
    assert scheduler.submit("chat", "a").lease is not None  # served at once: no queue used
    with pytest.raises(QueueFullError):
        scheduler.submit("chat", "b")
