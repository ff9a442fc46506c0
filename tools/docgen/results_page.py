"""docs/benchmarks/results.md from benchmarks/results/*.json: dated tables per GPU kind.

Figures live in the results files, written by the scripts that measured them;
this page only arranges them, so it never says what a file does not.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tools.docgen.markdown import GENERATED, code, table


@dataclass(frozen=True)
class Result:
    """One saved result: its file, what it holds, and when and where it was measured."""

    path: Path
    data: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def date(self) -> str:
        for key in ("when", "date"):
            value = self.data.get(key)
            if isinstance(value, str):
                return value[:10]
        return commit_date(self.path)

    @property
    def gpu(self) -> str:
        """The GPU kind, ``H100`` or ``H200``, from the file name or the GPU's own name."""
        match = re.search(r"nvidia_(h\d+)", self.name) or re.search(
            r"(H\d+)", str(self.data.get("gpu", ""))
        )
        return match.group(1).upper() if match else "CPU"


@cache
def commit_date(path: Path) -> str:
    """The day the file was last committed (results without a date of their own)."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        out = ""
    return out or "undated"


def load(results: Path) -> list[Result]:
    return [
        Result(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(results.glob("*.json"))
    ]


def _ms(summary: dict[str, Any] | None, key: str = "median") -> str:
    if not summary or summary.get(key) is None:
        return "—"
    return f"{summary[key]:.0f}"


def density_rows(items: list[Result]) -> list[list[str]]:
    counts = ("1", "8", "12", "16")
    rows = []
    for r in items:
        runs = r.data.get("runs", {})
        cells = []
        for n in counts:
            run = runs.get(n)
            latency = run.get("latency_ms") if run else None
            cells.append(f"{_ms(latency)} / {_ms(latency, 'p95')}" if latency else "—")
        dropped = sum(run.get("dropped_chunks", 0) for run in runs.values())
        rows.append(
            [
                code(r.name),
                r.date,
                str(r.data.get("max_realtime_sessions", "—")),
                *cells,
                str(dropped),
                _ms(r.data.get("chat_first_audio_ms")),
                _ms(r.data.get("chat_first_audio_ms_8_at_once")),
            ]
        )
    return rows


def equality_rows(items: list[Result]) -> list[list[str]]:
    rows = []
    for r in items:
        compared = r.data.get("units_compared", r.data.get("turns_compared", "—"))
        kind = "duplex units" if "units_compared" in r.data else "simplex turns"
        rows.append(
            [
                code(r.name),
                r.date,
                str(r.data.get("flavour", "—")),
                f"{compared} {kind}",
                "yes" if r.data.get("equal") else "**no**",
                str(r.data.get("max_logit_difference", "—")),
            ]
        )
    return rows


def other_rows(items: list[Result]) -> list[list[str]]:
    return [[code(r.name), r.date, r.path.stem.split("_nvidia")[0]] for r in items]


def cascade_rows(items: list[Result]) -> list[list[str]]:
    rows = []
    for r in items:
        s = r.data["summary_ms"]
        config = r.data.get("config", {})
        rows.append(
            [
                code(r.name),
                r.date,
                f"{config.get('chunk_s', '—')} s",
                *(
                    _ms(s.get(k))
                    for k in ("vad_end_of_speech", "asr", "llm_first_sentence", "tts_first_audio")
                ),
                _ms(s.get("end_to_end")),
            ]
        )
    return rows


def load_rows(items: list[Result]) -> list[list[str]]:
    rows = []
    for r in items:
        for level in r.data.get("levels", []):
            relay = level.get("relay_ms", {})
            rows.append(
                [
                    code(r.name),
                    r.date,
                    str(level.get("sessions")),
                    str(level.get("gateways", 1)),
                    f"{relay.get('p50', '—')}",
                    f"{relay.get('p99', '—')}",
                    str(level.get("protocol_errors", "—")),
                ]
            )
    return rows


def render(results: Path) -> str:
    items = load(results)
    out = [
        "# Benchmark results\n\n",
        GENERATED.format(source="benchmarks/results/*.json"),
        "\nEvery saved result, by the machine it ran on; dates are the run's own or, where "
        "a file has none, the day it was committed. How to run each script is on "
        "[Benchmarks](index.md); the plots are made from these files by "
        "`python -m benchmarks.plots`. Latencies in ms.\n",
    ]
    gpus = sorted({r.gpu for r in items} - {"CPU"})
    for gpu in gpus:
        mine = [r for r in items if r.gpu == gpu]
        out.append(f"\n## NVIDIA {gpu}\n")
        density = [r for r in mine if r.name.startswith("gpu_density") and "runs" in r.data]
        if density:
            out.append(
                "\n### Omni duplex sessions on one GPU (`gpu_density`)\n\n"
                "Unit latency p50 / p95 at N concurrent sessions; real time means p95 "
                "under 1 s with nothing dropped.\n\n"
            )
            header = ["file", "date", "max real-time N", "N=1", "N=8", "N=12", "N=16"]
            header += ["dropped", "chat first audio p50", "8 chats at once p50"]
            out.append(table(header, density_rows(density)))
        equal = [r for r in mine if "equality" in r.name]
        if equal:
            out.append("\n### Batched engine against the model's own code\n\n")
            header = ["file", "date", "flavour", "compared", "equal", "max logit difference"]
            out.append(table(header, equality_rows(equal)))
        rest = [r for r in mine if r not in density and r not in equal]
        if rest:
            out.append("\n### Other GPU measurements\n\n")
            out.append(table(["file", "date", "script"], other_rows(rest)))
    cpu = [r for r in items if r.gpu == "CPU"]
    out.append("\n## CPU\n")
    cascade = [r for r in cpu if r.name.startswith("cascade_latency")]
    if cascade:
        out.append(
            "\n### The cascade, end of speech to first audio (`cascade_latency`)\n\n"
            "Medians; the stages overlap (the ASR and the LLM start on a likely end of "
            "speech before the VAD decides), so they add up to more than end to end.\n\n"
        )
        header = ["file", "date", "chunk", "VAD", "ASR", "LLM first sentence", "TTS first audio"]
        out.append(table([*header, "end to end"], cascade_rows(cascade)))
    load_items = [r for r in cpu if r.name.startswith("load_")]
    if load_items:
        out.append(
            "\n### Gateway relay delay (`load`, scripted engine)\n\n"
            "From the worker stamping a duplex result to the client receiving it.\n\n"
        )
        header = ["file", "date", "sessions", "gateways", "relay p50", "relay p99", "errors"]
        out.append(table(header, load_rows(load_items)))
    rest = [r for r in cpu if r not in cascade and r not in load_items]
    out.append("\n### Other CPU measurements\n\n")
    out.append(table(["file", "date", "script"], other_rows(rest)))
    return "".join(out)
