"""Counters and histograms of the gateway, written in the Prometheus text format.

Small on purpose: a few families with fixed label names, updated on the
event loop (no locks), and rendered on each scrape together with gauges read
from the live state (queue, workers, sessions).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter as Tally
from collections.abc import Iterable
from typing import TYPE_CHECKING

from omnilive.gateway.live_stats import LiveStats, WorkerSlots

if TYPE_CHECKING:
    from omnilive.gateway.state import Gateway

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds; the relay delay sits in the low milliseconds, turns in seconds.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SLOW_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)

Labels = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Iterable[str], values: Iterable[str], extra: str = "") -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class CounterFamily:
    """A monotonic count per label set."""

    def __init__(self, name: str, help_text: str, label_names: Labels = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = label_names
        self.values: dict[Labels, float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for labels, value in sorted(self.values.items()):
            lines.append(f"{self.name}{_labels(self.label_names, labels)} {_number(value)}")
        return lines


class HistogramFamily:
    """Observations in cumulative buckets per label set."""

    def __init__(
        self, name: str, help_text: str, buckets: tuple[float, ...], label_names: Labels = ()
    ) -> None:
        self.name = name
        self.help = help_text
        self.buckets = buckets
        self.label_names = label_names
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = {}

    def observe(self, value: float, *labels: str) -> None:
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.buckets) + 1)
            self.sums[labels] = 0.0
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sums[labels] += value

    def quantile(self, q: float, *labels: str) -> float | None:
        """The upper bound of the bucket holding the q-quantile (for tests and logs)."""
        counts = self.counts.get(labels)
        if not counts:
            return None
        target, seen = q * sum(counts), 0
        for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
            seen += count
            if seen >= target:
                return bound
        return math.inf

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, counts in sorted(self.counts.items()):
            cumulative = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                cumulative += count
                le = f'le="{_number(bound)}"'
                lines.append(
                    f"{self.name}_bucket{_labels(self.label_names, labels, le)} {cumulative}"
                )
            label_text = _labels(self.label_names, labels)
            lines.append(f"{self.name}_sum{label_text} {_number(self.sums[labels])}")
            lines.append(f"{self.name}_count{label_text} {cumulative}")
        return lines


def _gauge(name: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {_number(value)}" for labels, value in samples]
    return lines


class GatewayMetrics:
    """Everything the gateway counts; one per app."""

    def __init__(self) -> None:
        self.started = time.time()
        # The last minutes, per worker, for the admin page (GET /api/admin/live).
        self.live = LiveStats()
        self.sessions_opened = CounterFamily(
            "omnilive_sessions_opened_total", "Session connections accepted, by mode.", ("mode",)
        )
        self.errors = CounterFamily(
            "omnilive_errors_total",
            "Errors sent to clients (protocol errors and refusals), by mode and code.",
            ("mode", "code"),
        )
        self.http_responses = CounterFamily(
            "omnilive_http_responses_total", "HTTP responses, by status code.", ("status",)
        )
        self.messages = CounterFamily(
            "omnilive_messages_total",
            "WebSocket messages relayed, by mode and direction (in: from clients).",
            ("mode", "direction"),
        )
        self.dropped_chunks = CounterFamily(
            "omnilive_dropped_chunks_total",
            "Duplex chunks dropped because the model was slower than real time.",
            ("mode",),
        )
        self.queue_wait = HistogramFamily(
            "omnilive_queue_wait_seconds",
            "Time from being queued to being served.",
            SLOW_BUCKETS,
            ("mode",),
        )
        self.relay_latency = HistogramFamily(
            "omnilive_relay_latency_seconds",
            "From a worker stamping a message (server_send_ts of a duplex result or of a "
            "Realtime event) to the gateway relaying it to the client.",
            FAST_BUCKETS,
            ("mode",),
        )
        self.unit_latency = HistogramFamily(
            "omnilive_unit_latency_seconds",
            "Duplex units: from the worker receiving a chunk to sending its result.",
            SLOW_BUCKETS,
            ("mode",),
        )
        self.turn_latency = HistogramFamily(
            "omnilive_turn_latency_seconds",
            "Chat and half-duplex turns: from the request (chat) or the end of speech "
            "(half-duplex) to the first audio chunk and to the end of the answer.",
            SLOW_BUCKETS,
            ("mode", "stage"),
        )

        self.resumes = CounterFamily(
            "omnilive_resumes_total",
            "Connections that asked to resume a suspended session, by outcome (resumed, refused).",
            ("outcome",),
        )

    def families(self) -> list[CounterFamily | HistogramFamily]:
        return [
            self.sessions_opened,
            self.resumes,
            self.errors,
            self.http_responses,
            self.messages,
            self.dropped_chunks,
            self.queue_wait,
            self.relay_latency,
            self.unit_latency,
            self.turn_latency,
        ]

    def render(self, gateway: Gateway | None) -> str:
        lines = _gauge("omnilive_uptime_seconds", "Seconds since the gateway started.",
                       [("", time.time() - self.started)])  # fmt: skip
        if gateway is not None:
            lines += _state_gauges(gateway)
        for family in self.families():
            lines += family.render()
        return "\n".join(lines) + "\n"


def queue_now(gateway: Gateway) -> tuple[int, float]:
    """Tickets waiting, and the oldest one's wait so far (seconds)."""
    scheduler = gateway.pool.scheduler
    now = scheduler.clock()
    oldest = max((now - t.enqueued_at for t in scheduler.queue.values()), default=0.0)
    return len(scheduler.queue), oldest


def live_reading(gateway: Gateway) -> tuple[int, float, list[WorkerSlots]]:
    """What a live sample reads from the gateway's state: the queue and every worker's slots."""
    length, oldest = queue_now(gateway)
    workers = [
        WorkerSlots(worker_id, len(record.leases), record.slots)
        for worker_id, record in sorted(gateway.pool.scheduler.workers.items())
    ]
    return length, oldest, workers


def _state_gauges(gateway: Gateway) -> list[str]:
    scheduler = gateway.pool.scheduler
    length, oldest = queue_now(gateway)
    workers = [link.describe() for link in gateway.links.values()]
    states = Tally(w["status"] for w in workers)
    restarts = gateway.supervisor.restarts if gateway.supervisor else {}
    sessions = gateway.sessions.by_kind()
    lines = _gauge("omnilive_queue_length", "Tickets waiting.", [("", length)])
    lines += _gauge("omnilive_queue_capacity", "max_queue_size.", [("", scheduler.max_queue_size)])
    lines += _gauge("omnilive_queue_oldest_wait_seconds", "Wait so far of the oldest ticket.",
                    [("", oldest)])  # fmt: skip
    lines += _gauge(
        "omnilive_workers",
        "Workers by state.",
        [(_labels(("state",), (state,)), count) for state, count in sorted(states.items())],
    )
    lines += _gauge(
        "omnilive_worker_slots",
        "Session slots of ready workers, in use or not.",
        [
            ('{use="busy"}', sum(w["slots_busy"] for w in workers)),
            ('{use="total"}', sum(w["slots"] for w in workers)),
        ],
    )
    lines += [
        "# HELP omnilive_worker_restarts_total Restarts of each supervised worker.",
        "# TYPE omnilive_worker_restarts_total counter",
        *(
            f"omnilive_worker_restarts_total{_labels(('worker',), (worker_id,))} {count}"
            for worker_id, count in sorted(restarts.items())
        ),
    ]
    lines += _gauge(
        "omnilive_sessions",
        "Sessions being served or queued, by mode.",
        [(_labels(("mode",), (mode,)), count) for mode, count in sorted(sessions.items())],
    )
    lines += _gauge(
        "omnilive_sessions_suspended",
        "Sessions whose client connection dropped, held for a resume.",
        [("", gateway.sessions.suspended())],
    )
    return lines
