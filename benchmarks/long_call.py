"""Calls of any length: duplex sessions run for many times their context,
their context sliding (issue "calls of any length").

``gpu``: ``omnilive serve --engine minicpmo`` and ``--sessions`` omni duplex
sessions through the gateway, each sending one second of audio and a frame
every second at wall-clock pace for ``--units`` units (gpu_density's
sessions). Reported: unit latency (send to result) p50/p95 over the first and
the last 100 units, chunks dropped, the context's length (at most, at the end)
and the units its window let go, GPU memory every 30 s (flat, or not), and
what an eviction costs: the server's wall clock of the unit that makes a
window's edits (the one after the unit that closed past the window) against
the others, and the other sessions' units sent in the same second.

``cpu``: one session in a slot of the batched engine over a tiny random
checkpoint of the published architecture (the model's code, as
``duplex_equality`` loads it), driven as fast as it runs for ``--units``
units (3,600: an hour of a call): the context's length bounded, the system
prompt's keys and values unchanged, the process's memory (RSS) at the start
and the end, errors.

Writes ``benchmarks/results/long_call_<gpu|cpu>.json`` (or ``--out``);
measures, asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_server
from benchmarks.gpu_checkpoint import synthetic_voice
from benchmarks.gpu_density import Start, paced_session
from benchmarks.gpu_duplex import (
    GpuSampler,
    jpeg_b64,
    model_code,
    summary,
)

RESULTS = Path(__file__).parent / "results"


def eviction_figures(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's unit wall clock of the units that made a window's edits
    against the others, and the other sessions' units sent within the same
    second. A result's ``evicted_units`` counts the units let go by the
    closes before it: the unit whose count rose is the one whose program
    made the edits (they wait for the next unit's forward)."""
    making, other, beside = [], [], []
    moments = []
    for index, s in enumerate(sessions):
        for previous, row in zip(s["units"], s["units"][1:], strict=False):
            if row["evicted_units"] > previous["evicted_units"]:
                making.append(row["wall_clock_ms"])
                moments.append((index, row["sent_at"]))
            else:
                other.append(row["wall_clock_ms"])
    for index, s in enumerate(sessions):
        for row in s["units"]:
            if any(owner != index and abs(row["sent_at"] - at) < 0.5 for owner, at in moments):
                beside.append(row["wall_clock_ms"])
    return {
        "edit_unit_wall_clock_ms": summary(making),
        "other_unit_wall_clock_ms": summary(other),
        "others_beside_an_edit_wall_clock_ms": summary(beside),
    }


def window_figures(sessions: list[dict[str, Any]], first: int, last: int) -> dict[str, Any]:
    rows = [r for s in sessions for r in s["units"]]
    early = [r["latency_ms"] for s in sessions for r in s["units"][first : first + 100]]
    late = [r["latency_ms"] for s in sessions for r in s["units"][-last:]]
    return {
        "latency_ms_first_100": summary(early),
        "latency_ms_last_100": summary(late),
        "latency_ms": summary([r["latency_ms"] for r in rows]),
        "dropped_chunks": sum(s["dropped"] for s in sessions),
        "kv_cache_length_max": max((r["kv_cache_length"] for r in rows), default=0),
        "kv_cache_length_last": [s["units"][-1]["kv_cache_length"] for s in sessions if s["units"]],
        "evicted_units": [s["units"][-1]["evicted_units"] for s in sessions if s["units"]],
        **eviction_figures(sessions),
    }


async def memory_every(sampler: GpuSampler, period_s: float, into: list[dict[str, float]]) -> None:
    started = time.perf_counter()
    while True:
        into.append({"s": round(time.perf_counter() - started), "mib": sampler.used_mib()})
        await asyncio.sleep(period_s)


async def gpu(args: argparse.Namespace) -> dict[str, Any]:
    ckpt = args.model_path.resolve()
    port = bench_server.free_port()
    env = bench_server.server_env(
        ckpt, args.speak_tokens, OMNILIVE_MINICPMO__SLOTS=str(args.sessions)
    )
    sampler = GpuSampler()
    report: dict[str, Any] = {
        "gpu": GpuSampler.query("name") or "no GPU",
        "model_code": model_code(ckpt),
        "sessions": args.sessions,
        "units_per_session": args.units,
        "speak_tokens_per_unit": args.speak_tokens,
        "memory": [],
    }
    server, log = bench_server.start_server(args, ckpt, port, env)
    sampler.start()
    try:
        report["load_s"] = round(
            await bench_server.wait_ready(f"http://127.0.0.1:{port}", server, 600), 1
        )
        voice = synthetic_voice(3.0)
        frames = [jpeg_b64(seed) for seed in range(8)]
        start = Start(args.sessions, "spread")
        meter = asyncio.create_task(
            memory_every(sampler, 30.0, report["memory"]), name="long_call:memory"
        )
        try:
            ws = f"ws://127.0.0.1:{port}"
            sessions = await asyncio.gather(
                *(paced_session(ws, k, args.units, 3, voice, frames, start)
                  for k in range(args.sessions))
            )  # fmt: skip
        finally:
            meter.cancel()
        report.update(window_figures(sessions, args.warmup_units, 100))
        report["peak_mib"] = sampler.peak_mib
    finally:
        sampler.stop()
        bench_server.stop_server(server, log)
    return report


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return round(pages * resource.getpagesize() / 2**20, 1)


async def cpu(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    from benchmarks.duplex_equality import load_reference, load_voice
    from omnilive.engines.messages import ContextWindow, WindowMode
    from omnilive.engines.minicpmo.sessions.duplex.session import SlotDuplex
    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.shared import SharedModel, slot_loop

    sys.path.insert(0, str(args.ckpt / "standin"))
    duplex = load_reference(args.ckpt, "unified", "cpu", "float32", budget=8, forced=0)
    shared = SharedModel.of_duplex(duplex, UnitRules.unified())
    loop = slot_loop(duplex.model, 1, args.capacity)
    window = ContextWindow(WindowMode(args.mode), args.high, args.low, max_units=args.max_units)
    report: dict[str, Any] = {"units": args.units, "window": vars(window), "errors": []}
    try:
        slot = await loop.acquire()
        session = SlotDuplex(shared, loop, slot, seed=0, max_speak_tokens=8, window=window)
        voice = load_voice(args.ckpt / "voice.wav")
        prompt = await session.prepare("You are a helpful assistant.", None, voice, voice)
        cache = loop.steps.cache
        system = [k[slot, :, :prompt].clone() for k in cache.key_cache]
        rng = np.random.default_rng(0)
        lengths, unit_ms, rss = [], [], [{"unit": 0, "mib": rss_mib()}]
        started = time.perf_counter()
        for u in range(args.units):
            audio = rng.normal(0, 0.05, 16_000).astype(np.float32)
            begun = time.perf_counter()
            try:
                await session.unit(audio, None, force_listen=u % 3 == 0)
                await session.finalize()
            except RuntimeError as exc:  # a slot's overflow among them: counted, a figure here
                report["errors"].append(f"unit {u}: {exc}")
                continue
            unit_ms.append((time.perf_counter() - begun) * 1000)
            lengths.append(session.kv_length)
            if (u + 1) % 300 == 0:
                rss.append({"unit": u + 1, "mib": rss_mib()})
                print(f"unit {u + 1}: context {session.kv_length}, rss {rss[-1]['mib']} MiB",
                      flush=True)  # fmt: skip
        ledger = session.context.ledger if session.context else None
        report.update(
            seconds=round(time.perf_counter() - started, 1),
            unit_ms=summary(unit_ms),
            context_max=max(lengths, default=0),
            context_last=lengths[-1] if lengths else 0,
            evicted_units=ledger.evicted_units if ledger else 0,
            evictions=ledger.evictions if ledger else 0,
            system_prompt_kept=all(
                torch.equal(k[slot, :, :prompt], s)
                for k, s in zip(cache.key_cache, system, strict=True)
            ),
            rss_mib=rss,
        )
        await loop.release(slot)
    finally:
        loop.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    on_gpu = kinds.add_parser("gpu", help="sessions through a server on a GPU, paced")
    on_gpu.add_argument("--model-path", type=Path, required=True)
    on_gpu.add_argument("--sessions", type=int, default=1)
    on_gpu.add_argument("--units", type=int, default=480)
    on_gpu.add_argument("--warmup-units", type=int, default=2)
    on_gpu.add_argument("--speak-tokens", type=int, default=12)
    bench_server.add_server_arguments(on_gpu, "/tmp/long_call_server.log", "/tmp/long_call_data")
    on_cpu = kinds.add_parser("cpu", help="one session of the batched engine, a tiny checkpoint")
    on_cpu.add_argument("--ckpt", type=Path, required=True)
    on_cpu.add_argument("--units", type=int, default=3600)
    on_cpu.add_argument("--capacity", type=int, default=8192)
    on_cpu.add_argument("--mode", default="basic", choices=["basic", "context"])
    on_cpu.add_argument("--high", type=int, default=4000)
    on_cpu.add_argument("--low", type=int, default=3500)
    on_cpu.add_argument("--max-units", type=int, default=24)
    on_cpu.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = asyncio.run(gpu(args) if args.kind == "gpu" else cpu(args))
    out = args.out or RESULTS / f"long_call_{args.kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k not in ("memory", "rss_mib")},
                     indent=2, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
