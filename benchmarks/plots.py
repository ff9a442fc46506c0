"""The documentation's plots, made from the saved results: ``python -m benchmarks.plots``.

Reads benchmarks/results/*.json (nothing is measured here) and writes SVG files
into docs/images/ (or ``--out``):

  unit_latency.svg       omni duplex unit latency p50 / p95 against concurrent
                         sessions, per GPU kind, with the 1 s real-time line
  chat_first_audio.svg   chat first audio p50, alone and 8 at once, per GPU run
  cascade_breakdown.svg  the cascade's end of speech to first audio: its stages
                         (VAD, ASR, LLM, TTS) as stacked bars, and end to end
  relay_delay.svg        the gateway's relay delay p50 / p99 against sessions

The SVGs are written without a date and with a fixed hash salt, so the same
results and the same matplotlib make the same files.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display: chosen before pyplot loads
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from benchmarks.saved import RESULTS, cascade_runs, density_runs, load_results

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
REAL_TIME_MS = 1000.0


def plot_unit_latency(ax: Axes, results: dict[str, dict[str, Any]]) -> None:
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, data) in enumerate(density_runs(results)):
        counts = sorted(int(n) for n in data["runs"])
        latency = [data["runs"][str(n)]["latency_ms"] for n in counts]
        color = colors[index % len(colors)]
        ax.plot(counts, [s["median"] for s in latency], "o-", color=color, label=f"{label} p50")
        ax.plot(counts, [s["p95"] for s in latency], "s--", color=color, label=f"{label} p95")
    ax.axhline(REAL_TIME_MS, color="black", linewidth=1, label="real time (1 s a unit)")
    ax.set_xlabel("concurrent omni duplex sessions on one GPU")
    ax.set_ylabel("unit latency (ms)")
    ax.set_title("Unit latency against sessions (minicpmo.slots)")
    ax.legend(fontsize="small", ncol=2)
    ax.grid(alpha=0.3)


def plot_chat_first_audio(ax: Axes, results: dict[str, dict[str, Any]]) -> None:
    runs = [(label, d) for label, d in density_runs(results) if "chat_first_audio_ms" in d]
    positions = range(len(runs))
    alone = [d["chat_first_audio_ms"]["median"] for _, d in runs]
    together = [d["chat_first_audio_ms_8_at_once"]["median"] for _, d in runs]
    ax.bar([p - 0.2 for p in positions], alone, width=0.4, label="alone")
    ax.bar([p + 0.2 for p in positions], together, width=0.4, label="8 at once")
    ax.set_xticks(list(positions), [label for label, _ in runs])
    ax.set_ylabel("first audio after the request, p50 (ms)")
    ax.set_title("Chat first audio on the GPU engine")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)


CASCADE_STAGES = (
    ("vad_end_of_speech", "VAD end of speech"),
    ("asr", "ASR"),
    ("llm_first_sentence", "LLM first sentence"),
    ("tts_first_audio", "TTS first audio"),
)


def plot_cascade_breakdown(ax: Axes, results: dict[str, dict[str, Any]]) -> None:
    runs = [
        run
        for name, data in results.items()
        if name.startswith("cascade_latency")
        for run in cascade_runs(name, data)
    ]
    # "chunk0.1s_silence800ms_both_piper: end_of_turn" -> "0.1 s chunks both piper: end of turn"
    labels = [
        re.sub(r"chunk([\d.]+)s_silence\d+ms", r"\1 s chunks", label).replace("_", " ")
        for label, _ in runs
    ]
    lefts = [0.0] * len(runs)
    for key, stage in CASCADE_STAGES:
        values = [run["summary_ms"][key]["median"] for _, run in runs]
        ax.barh(labels, values, left=lefts, label=stage, height=0.5)
        lefts = [left + v for left, v in zip(lefts, values, strict=True)]
    end_to_end = [run["summary_ms"]["end_to_end"]["median"] for _, run in runs]
    ax.plot(end_to_end, labels, "kD", markersize=8, label="end to end (stages overlap)")
    ax.invert_yaxis()
    ax.set_xlabel("median (ms)")
    ax.set_title("The cascade, end of speech to first audio (2 CPU cores)", loc="right")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    ax.grid(axis="x", alpha=0.3)


def plot_relay_delay(ax: Axes, results: dict[str, dict[str, Any]]) -> None:
    series: dict[str, list[tuple[int, float, float]]] = {}
    for name, data in results.items():
        if not name.startswith("load_"):
            continue
        for level in data.get("levels", []):
            gateways = level.get("gateways", 1)
            key = (
                "one gateway"
                if gateways == 1 and not level.get("on_ray")
                else (f"{gateways} gateway{'s' if gateways > 1 else ''} on Ray")
            )
            relay = level["relay_ms"]
            series.setdefault(key, []).append((level["sessions"], relay["p50"], relay["p99"]))
    for key, points in sorted(series.items()):
        points.sort()
        sessions = [p[0] for p in points]
        (line,) = ax.plot(sessions, [p[1] for p in points], "o-", label=f"{key} p50")
        ax.plot(sessions, [p[2] for p in points], "s--", color=line.get_color(), label=f"{key} p99")
    ax.set_xlabel("concurrent duplex sessions (scripted engine, 2 CPU cores)")
    ax.set_yscale("log")
    ax.set_ylabel("relay delay, worker to client (ms, log)")
    ax.set_title("Gateway relay delay against sessions")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


PLOTS: dict[str, Callable[[Axes, dict[str, dict[str, Any]]], None]] = {
    "unit_latency.svg": plot_unit_latency,
    "chat_first_audio.svg": plot_chat_first_audio,
    "cascade_breakdown.svg": plot_cascade_breakdown,
    "relay_delay.svg": plot_relay_delay,
}


def make_plots(results: Path = RESULTS, out: Path = IMAGES) -> list[Path]:
    """Every plot of :data:`PLOTS` from ``results`` into ``out``; the paths written."""
    plt.rcParams["svg.hashsalt"] = "omnilive"
    data = load_results(results)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plot in PLOTS.items():
        figure: Figure = plt.figure(figsize=(9.5, 5))
        plot(figure.add_subplot(), data)
        figure.tight_layout()
        path = out / name
        figure.savefig(path, metadata={"Date": None})
        plt.close(figure)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=IMAGES)
    args = parser.parse_args()
    for path in make_plots(args.results, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
