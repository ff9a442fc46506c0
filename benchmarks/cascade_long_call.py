"""The embedded cascade through a long call (issue "calls of any length"):
does it answer at the end as at the start?

Starts ``omnilive serve --engine cascade`` and holds, one after the other
(``--modes``), for ``--minutes`` each:

``half_duplex``: one ``/ws/half_duplex`` session asked the benchmark's spoken
questions (espeak-ng) in a cycle at microphone pace, each answered before
the next, as a person on the phone would: every turn's end of speech to first
answer audio, and its answer.

``duplex``: one ``/ws/duplex`` session fed one second of audio a second at
wall-clock pace: a question, then ``--gap-s`` seconds of silence, again and
again; which questions the model spoke after (a speaking unit before the
next question began), the end of the question to its first speaking unit,
every unit's latency (sent to result), its context's length and the units
its window let go.

Compared: the first and the last ``--compare`` turns or questions. Writes
``benchmarks/results/cascade_long_call.json`` (or ``--out``); measures,
asserts nothing.

    python -m benchmarks.cascade_long_call [--minutes 30] [--modes half_duplex,duplex]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from tests.speech import silence, speak
from websockets.asyncio.client import connect

from benchmarks.cascade_latency import QUESTIONS, RESULTS
from benchmarks.gpu_duplex import b64, recv_until
from benchmarks.load import this_machine
from benchmarks.microphone import RATE, Microphone, spoken_turn

SYSTEM = "You are a helpful assistant on the phone. Answer in one short sentence."


def figures(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(values), "median": round(statistics.median(values), 1), "p95": round(p95, 1)}


def compared(rows: list[dict[str, Any]], key: str, count: int) -> dict[str, Any]:
    """``key``'s figures over the first and the last ``count`` rows that have it."""
    values = [(r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return {"first": figures(values[:count]), "last": figures(values[-count:])}


async def prepared(ws: Any) -> None:
    await recv_until(ws, "queue_done", timeout=300)
    await ws.send(json.dumps({"type": "prepare", "system_prompt": SYSTEM}))
    await recv_until(ws, "prepared", timeout=300)


async def half_duplex(server: Server, seconds: float, spoken: list[tuple[str, np.ndarray]]):
    rows: list[dict[str, Any]] = []
    url = f"{server.ws}/ws/half_duplex/long_{time.monotonic_ns()}"
    async with connect(url, max_size=None) as ws:
        await prepared(ws)
        mic = Microphone(ws, 0.1)
        await mic.play(silence(0.6))
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            question, speech = spoken[len(rows) % len(spoken)]
            turn = await spoken_turn(ws, mic, speech)
            rows.append({
                "at_s": round(time.monotonic() - start, 1),
                "question": question,
                "answer": turn.done.get("text", ""),
                "e2e_ms": turn.first_audio_ms,
            })  # fmt: skip
            print(f"half-duplex {rows[-1]['at_s']:7.1f} s  e2e {turn.first_audio_ms:6.0f} ms  "
                  f"{question!r} -> {rows[-1]['answer'][:60]!r}", flush=True)  # fmt: skip
            await asyncio.sleep(0.8)
        await ws.send(json.dumps({"type": "stop"}))
    return rows


def tape(spoken: list[tuple[str, np.ndarray]], seconds: float, gap_s: float):
    """The duplex call's audio: questions with ``gap_s`` of silence after
    each, whole seconds; and where each question's speech ends (in units)."""
    pieces, ends, questions, length = [], [], [], 0
    while length < seconds * RATE:
        question, speech = spoken[len(ends) % len(spoken)]
        pieces += [speech, silence(gap_s)]
        length += speech.size + round(gap_s * RATE)
        ends.append((length - round(gap_s * RATE)) / RATE)
        questions.append(question)
    audio = np.concatenate(pieces)[: int(seconds) * RATE].astype(np.float32)
    return audio, ends, questions


async def duplex(server: Server, seconds: float, spoken: list[tuple[str, np.ndarray]], gap_s):
    audio, ends, questions = tape(spoken, seconds, gap_s)
    units = audio.size // RATE
    sent_at: list[float] = []
    rows: list[dict[str, Any]] = []
    url = f"{server.ws}/ws/duplex/long_{time.monotonic_ns()}?mode=audio_duplex"
    async with connect(url, max_size=None) as ws:
        await prepared(ws)
        first = time.perf_counter() + 0.5

        async def send() -> None:
            for k in range(units):
                await asyncio.sleep(max(0.0, first + k - time.perf_counter()))
                sent_at.append(time.perf_counter())
                chunk = audio[k * RATE : (k + 1) * RATE]
                await ws.send(json.dumps({"type": "audio_chunk", "audio_base64": b64(chunk)}))

        sender = asyncio.create_task(send(), name="long-call-sender")
        chunk = 0
        try:
            while chunk < units:
                result = await recv_until(ws, "result", timeout=120)
                chunk += int(result.get("dropped_chunks") or 0)
                if chunk >= units:
                    break
                rows.append({
                    "unit": chunk,
                    "latency_ms": round((time.perf_counter() - sent_at[chunk]) * 1000, 1),
                    "speaking": not result.get("is_listen", True),
                    "text": result.get("text", ""),
                    "kv_cache_length": result.get("kv_cache_length"),
                    "evicted_units": result.get("evicted_units", 0),
                })  # fmt: skip
                if chunk % 60 == 0:
                    print(f"duplex unit {chunk}: {rows[-1]}", flush=True)
                chunk += 1
        finally:
            await sender
        await ws.send(json.dumps({"type": "stop"}))
    return rows, answered(rows, ends, questions, units)


def answered(rows: list[dict[str, Any]], ends: list[float], questions: list[str], units: int):
    """Per question that ended in the call: whether the model spoke before
    the next began, and how long after its end (units are 1 s: a unit k
    holds audio [k, k+1) and is answered once it is in)."""
    speaking = {r["unit"]: r for r in rows if r["speaking"]}
    out = []
    for index, end in enumerate(ends):
        following = ends[index + 1] - 3 if index + 1 < len(ends) else units  # its speech starts
        if end + 1 > units:
            break
        spoke = [u for u in sorted(speaking) if end <= u + 1 < following]
        out.append({
            "question": questions[index],
            "ended_s": round(end, 1),
            "answered": bool(spoke),
            "first_speech_after_s": round(spoke[0] + 1 - end, 1) if spoke else None,
            "said": "".join(speaking[u]["text"] for u in spoke)[:200],
        })  # fmt: skip
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    spoken = [(q, speak(q)) for q in QUESTIONS]
    seconds = args.minutes * 60
    result: dict[str, Any] = {
        "benchmark": "cascade_long_call",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": this_machine(),
        "minutes": args.minutes,
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), engine="cascade").start()
        try:
            await server.wait_ready(timeout=600, workers=1)
            if "half_duplex" in args.modes:
                rows = await half_duplex(server, seconds, spoken)
                result["half_duplex"] = {
                    "turns": len(rows),
                    "answered": sum(bool(r["answer"].strip()) for r in rows),
                    "e2e_ms": compared(rows, "e2e_ms", args.compare),
                    "answered_first": sum(bool(r["answer"].strip()) for r in rows[: args.compare]),
                    "answered_last": sum(bool(r["answer"].strip()) for r in rows[-args.compare :]),
                    "rows": rows,
                }
            if "duplex" in args.modes:
                rows, questions = await duplex(server, seconds, spoken, args.gap_s)
                lengths = [r["kv_cache_length"] for r in rows if r["kv_cache_length"] is not None]
                result["duplex"] = {
                    "units": len(rows),
                    "latency_ms": compared(rows, "latency_ms", 100),
                    "questions": len(questions),
                    "answered_first": sum(q["answered"] for q in questions[: args.compare]),
                    "answered_last": sum(q["answered"] for q in questions[-args.compare :]),
                    "first_speech_after_s": compared(
                        questions, "first_speech_after_s", args.compare
                    ),
                    "kv_cache_length_max": max(lengths, default=None),
                    "kv_cache_length_last": lengths[-1] if lengths else None,
                    "evicted_units": max((r["evicted_units"] for r in rows), default=0),
                    "questions_heard": questions,
                }
        finally:
            server.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--modes", default="half_duplex,duplex")
    parser.add_argument("--gap-s", type=float, default=12.0)
    parser.add_argument("--compare", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "cascade_long_call.json")
    args = parser.parse_args()
    args.modes = set(args.modes.split(","))
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for mode in ("half_duplex", "duplex"):
        if mode in result:
            shown = {k: v for k, v in result[mode].items() if k not in ("rows", "questions_heard")}
            print(mode, json.dumps(shown))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
