"""What the GPU engine says about itself in the server's log, read by the
density benchmark: one slot's memory (at start-up) and, from the line each
duplex session logs when its slot is released, the thread hand-offs per unit,
where the engine's threads spent their time and the lanes' CUDA graphs (the
vocoder's parts, the vision encoder's).

The released slot's line carries counters since the engine started; a
level of the benchmark is the difference between the last line before it
and the last line of it (:func:`busy_between`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

HANDOFFS = re.compile(
    r"thread hand-offs per speaking unit ([\d.]+) \((\d+) units\), "
    r"per listening unit ([\d.]+) \((\d+) units\)"
)
# The released slot's counters: "busy {...}; lane graphs {...}" (Python reprs;
# "vocoder graphs" before the vision encoder's graphs were counted with them).
COUNTERS = re.compile(r"; busy (\{.*?\})(?:; (?:lane|vocoder) graphs (\{.*\}))?$", re.MULTILINE)

Busy = dict[str, dict[str, float]]


def slot_gib(log: Path) -> float | None:
    """The engine's own figure for one slot's memory, from its start-up line."""
    found = re.search(r"session slots of \d+ positions \(([\d.]+) GiB each", log.read_text())
    return float(found.group(1)) if found else None


def handoffs(text: str, since: int) -> dict[str, float | None]:
    """The engine's thread hand-offs per speaking and per listening unit over
    the sessions that ended after offset ``since`` of the log's ``text``
    (each logs its own when its slot is released)."""
    totals = {"speak": [0.0, 0], "listen": [0.0, 0]}
    for found in HANDOFFS.finditer(text, since):
        for kind, per, units in (("speak", 1, 2), ("listen", 3, 4)):
            totals[kind][0] += float(found.group(per)) * int(found.group(units))
            totals[kind][1] += int(found.group(units))
    return {
        kind: round(spent / units, 1) if units else None for kind, (spent, units) in totals.items()
    }


def counters(text: str, until: int | None = None) -> tuple[Busy, dict[str, Any]]:
    """The last released slot's busy counters and lane graphs before offset
    ``until`` of the log's ``text`` (empty where no slot was released)."""
    found = list(COUNTERS.finditer(text, 0, len(text) if until is None else until))
    if not found:
        return {}, {}
    last = found[-1]
    graphs = ast.literal_eval(last.group(2)) if last.group(2) else {}
    return ast.literal_eval(last.group(1)), graphs


def busy_between(before: Busy, after: Busy, seconds: float) -> Busy:
    """Each kind of work's seconds, count, mean milliseconds and share of
    ``seconds`` (percent) from counters ``before`` to ``after``, the busiest
    first; kinds with no call between them are left out."""
    spent = {}
    for kind, now in after.items():
        then = before.get(kind, {"s": 0.0, "n": 0})
        calls, busy_s = now["n"] - then["n"], now["s"] - then["s"]
        if calls > 0:
            spent[kind] = {
                "s": round(busy_s, 2),
                "n": calls,
                "mean_ms": round(1000 * busy_s / calls, 1),
                "busy_percent": round(100 * busy_s / seconds, 1),
            }
    return dict(sorted(spent.items(), key=lambda item: -item[1]["s"]))
