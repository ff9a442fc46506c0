"""Reading the saved results (benchmarks/results/*.json) for the plots and the docs.

Results files differ in shape by script and by age; what reads several of them
(``benchmarks.plots``, ``tools.docgen``) finds its runs here, in one place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# The density runs the plots show as the engine's figures, by label: the
# latest runs of each GPU kind at the benchmark's default (spread) phases. The
# other gpu_density files are earlier states and experiments, kept for their
# history and listed on the results page. Named here, not found by a pattern:
# which runs are current is a choice made when they are measured.
CURRENT_DENSITY = (
    # The encoders' CUDA graphs on (the default since issue 35): runs 1-3 on
    # one H100 machine (issue35h), 4-6 on another, slower one (issue35i).
    ("H100 run 1", "gpu_density_nvidia_h100_issue35h_graphs_run1.json"),
    ("H100 run 2", "gpu_density_nvidia_h100_issue35h_graphs_run2.json"),
    ("H100 run 3", "gpu_density_nvidia_h100_issue35h_graphs_run3.json"),
    ("H100 run 4", "gpu_density_nvidia_h100_issue35i_run1.json"),
    ("H100 run 5", "gpu_density_nvidia_h100_issue35i_run2.json"),
    ("H100 run 6", "gpu_density_nvidia_h100_issue35i_run3.json"),
    # Three H200 machines at the head of issue35p (kept voices, the answers'
    # vocoder warm-up, 64 flow graphs, the chats' own prompt processor, the
    # mixed load); issue35o's three runs, one machine, are the same engine
    # before the prompt processor.
    ("H200 run 1", "gpu_density_nvidia_h200_issue35p_run1.json"),
    ("H200 run 2", "gpu_density_nvidia_h200_issue35p_run2.json"),
    ("H200 run 3", "gpu_density_nvidia_h200_issue35p_run3.json"),
)


def load_results(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every results file by name, in name order."""
    return {p.name: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def density_runs(results: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(label, result) for each of :data:`CURRENT_DENSITY` in ``results``."""
    return [(label, results[name]) for label, name in CURRENT_DENSITY if name in results]


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
