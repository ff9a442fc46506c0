"""docs/benchmarks/results.md from benchmarks/results/*.json: dated tables per GPU kind.

Figures live in the results files, written by the scripts that measured them;
this page only arranges them, so it never says what a file does not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.saved import cascade_runs

from tools.docgen.markdown import code, page_head, section

OTHER = ["file", "date", "script"]
DENSITY_COUNTS = ("1", "8", "12", "16")  # the session counts shown of a density run
CASCADE_STAGES = (
    ("vad_end_of_speech", "VAD"),
    ("asr", "ASR"),
    ("llm_first_sentence", "LLM first sentence"),
    ("tts_first_audio", "TTS first audio"),
)


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
        for run in (self.data, *self.data.values()):  # a file of several runs dates each
            for key in ("when", "date"):
                value = run.get(key) if isinstance(run, dict) else None
                if isinstance(value, str):
                    return value[:10]
        return "undated"

    @property
    def gpu(self) -> str:
        """The GPU kind, ``H100`` or ``H200``, from the file name or the GPU's own name."""
        match = re.search(r"nvidia_(h\d+)", self.name) or re.search(
            r"(H\d+)", str(self.data.get("gpu", ""))
        )
        return match.group(1).upper() if match else "CPU"


def load(results: Path) -> list[Result]:
    return [
        Result(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(results.glob("*.json"))
    ]


def _ms(summary: dict[str, Any] | None, key: str = "median") -> str:
    if not summary or summary.get(key) is None:
        return "—"
    return f"{summary[key]:.0f}"


def density_rows(items: list[Result]) -> list[list[str]]:
    rows = []
    for r in items:
        runs = r.data.get("runs", {})
        cells = []
        for n in DENSITY_COUNTS:
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
        for label, run in cascade_runs(r.name, r.data):
            s = run["summary_ms"]
            config = run.get("config", {})
            rows.append(
                [
                    code(r.name) + (f" ({label.split(': ', 1)[1]})" if ": " in label else ""),
                    run.get("when", r.date)[:10],
                    f"{config.get('chunk_s', '—')} s",
                    *(_ms(s.get(key)) for key, _ in CASCADE_STAGES),
                    _ms(s.get("end_to_end")),
                ]
            )
    return rows


def heldout_rows(items: list[Result]) -> list[list[str]]:
    """``cascade_heldout`` (live) and ``turn_verdicts`` (offline, per rule)."""
    rows = []
    for r in items:
        if r.name.startswith("cascade_heldout"):
            s = r.data.get("summary", {})
            e2e = s.get("end_to_end_ms", {})
            rows.append([code(r.name), r.date, "live", _ms(e2e), _ms(e2e, "p90"),
                         f"{s.get('waited', '—')} / {s.get('questions', '—')}",
                         f"{s.get('paused_turns_cut', '—')} / {s.get('paused_turns', '—')}",
                         str(s.get("questions_cut_in_on", "—"))])  # fmt: skip
            continue
        for rule, s in r.data.get("rules", {}).items():
            delay = s.get("delay_ms", {})
            rows.append([code(r.name) + f" ({rule})", r.date, "offline, decision only",
                         _ms(delay), _ms(delay, "p90"),
                         f"{delay.get('over_1000', '—')} / {delay.get('n', '—')}",
                         f"{s.get('paused_turns_cut', '—')} / {s.get('paused_turns', '—')}",
                         str(s.get("questions_cut_in_on", "—"))])  # fmt: skip
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
        page_head(
            "Benchmark results",
            "benchmarks/results/*.json",
            "Every saved result, by the machine it ran on; dates are the run's own or, where "
            "a file has none, the day it was committed. How to run each script is on "
            "[Benchmarks](index.md); the plots are made from these files by "
            "`python -m benchmarks.plots`. Latencies in ms.",
        )
    ]
    for gpu in sorted({r.gpu for r in items} - {"CPU"}):
        mine = [r for r in items if r.gpu == gpu]
        density = [r for r in mine if r.name.startswith("gpu_density") and "runs" in r.data]
        equal = [r for r in mine if "equality" in r.name]
        rest = [r for r in mine if r not in density and r not in equal]
        out += [
            f"\n## NVIDIA {gpu}\n",
            section(
                "### Omni duplex sessions on one GPU (`gpu_density`)",
                "Unit latency p50 / p95 at N concurrent sessions; real time means p95 "
                "under 1 s with nothing dropped.",
                [
                    "file",
                    "date",
                    "max real-time N",
                    *(f"N={n}" for n in DENSITY_COUNTS),
                    "dropped",
                    "chat first audio p50",
                    "8 chats at once p50",
                ],
                density_rows(density),
            ),
            section(
                "### Batched engine against the model's own code",
                "",
                ["file", "date", "flavour", "compared", "equal", "max logit difference"],
                equality_rows(equal),
            ),
            section("### Other GPU measurements", "", OTHER, other_rows(rest)),
        ]
    cpu = [r for r in items if r.gpu == "CPU"]
    cascade = [r for r in cpu if r.name.startswith("cascade_latency")]
    load_items = [r for r in cpu if r.name.startswith("load_")]
    heldout = [r for r in cpu if r.name.startswith(("cascade_heldout", "turn_verdicts"))]
    rest = [r for r in cpu if r not in cascade and r not in load_items and r not in heldout]
    out += [
        "\n## CPU\n",
        section(
            "### The cascade, end of speech to first audio (`cascade_latency`)",
            "Medians; the stages overlap (the ASR and the LLM start on a likely end of "
            "speech before the VAD decides), so they add up to more than end to end.",
            [
                "file",
                "date",
                "chunk",
                *(label for _, label in CASCADE_STAGES),
                "end to end",
            ],
            cascade_rows(cascade),
        ),
        section(
            "### Turn-taking on voices the cascade was not tuned to "
            "(`cascade_heldout`, `turn_verdicts`)",
            "Held-out questions and paused turns in espeak-ng voices. Live: end of speech "
            "to first answer audio, questions held past 1 s, paused turns cut at their "
            "pause. Offline: the silence after the speech when the rule ends the turn "
            "(no answer time), on the judges' recorded verdicts.",
            ["file", "date", "how", "p50", "p90", "held > 1 s", "paused cut", "questions cut"],
            heldout_rows(heldout),
        ),
        section(
            "### Gateway relay delay (`load`, scripted engine)",
            "From the worker stamping a duplex result to the client receiving it.",
            ["file", "date", "sessions", "gateways", "relay p50", "relay p99", "errors"],
            load_rows(load_items),
        ),
        section("### Other CPU measurements", "", OTHER, other_rows(rest)),
    ]
    return "".join(out)
