"""Reading the saved results (benchmarks/results/*.json) for the plots and the docs.

Results files differ in shape by script and by age; what reads several of them
(``benchmarks.plots``, ``tools.docgen``) finds its runs here, in one place.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# The density runs of the current engine: gpu_density_nvidia_<kind>[_run<k>].json
# (the other gpu_density files are earlier states, kept for their history).
DENSITY = re.compile(r"^gpu_density_nvidia_(h\d+)(?:_run(\d+))?\.json$")


def load_results(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every results file by name, in name order."""
    return {p.name: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def density_runs(results: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(label, result) for each current density run: ``H100 run 1``, ``H200``."""
    runs = []
    for name, data in results.items():
        match = DENSITY.match(name)
        if match:
            label = match.group(1).upper() + (f" run {match.group(2)}" if match.group(2) else "")
            runs.append((label, data))
    return runs


def cascade_runs(name: str, data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, run) for each run of a ``cascade_latency`` file: one run, or, for a
    file comparing turn-taking rules (``--both``), one per rule."""
    stem = name.removeprefix("cascade_latency_").removesuffix(".json")
    if "summary_ms" in data:
        return [(stem, data)]
    return [
        (f"{stem}: {key}", run)
        for key, run in data.items()
        if isinstance(run, dict) and "summary_ms" in run
    ]
