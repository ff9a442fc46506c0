"""How many omni duplex sessions one GPU serves in real time.

``python -m benchmarks.gpu_density --model-path CKPT [--counts 1,8,16,24,32,40]
[--units 14] [--slots 40]`` (the defaults are issue 61's protocol; from a bare
GPU machine to a result: docs/benchmarks/index.md) starts ``omnilive serve
--engine minicpmo`` with ``--slots`` slots (the largest count unless given),
then for each N runs N omni duplex sessions at once through the gateway, each
for ``--units`` seconds: one second of audio and one camera frame every second at
wall-clock pace (not waiting for results, as a browser does), their first
chunks spread over a second (``--phases spread``: independent users; until
a session's voice was kept, its slow prepare staggered the sessions so, by
chance) or all at once (``--phases aligned``), with a known
listen/speak mix (a forced listen every third unit, speak units bounded to
``--speak-tokens`` text tokens, as ``gpu_duplex.py``). Per N: each unit's
latency from its chunk's send to its result (p50/p95), the server's unit wall
clock, the chunks the server dropped, the latency of units that start a turn
(first audio after a speak decision), the worker's CPU seconds per second,
the engine's thread hand-offs per speaking and listening unit, where its
threads spent the level's time (``engine_busy``: the batch loop's work by
kind, the lanes' calls; seconds, calls, mean ms, percent of the level) and
the lanes' CUDA graphs (the vocoder's and the vision encoder's;
``vocoder_graphs`` in results before 2026-11-28; all from the engine's log:
``engine_log.py``),
GPU memory and the share of time a GPU kernel ran. The largest N with p95
latency at most 1 s and no dropped chunk, at that N and every smaller one
measured, is ``max_realtime_sessions``.

Then the single-session chat figures: first audio over ``--chats`` warm
requests one after another, and over 8 at once, each with the moments before
it (the prompt in the context, the first text chunk). Eight at once runs
twice: the first round, when the vocoder's lane first meets the shapes of
eight first pieces together (eager runs and graph captures), is reported as
``*_8_at_once_first`` (results before 2026-11-28 hold only that round, as
``*_8_at_once``); the second is ``*_8_at_once``.

Last, a mixed load (``--mixed N``, 8 by default; results before 2026-11-29
have none): N omni sessions as above with chats beside them, ``--mixed-chats``
at once in rounds, the sessions' figures and the chats' marks under that load.
It runs twice, as the chats: ``mixed_first`` (the vocoder first meets duplex
and chat pieces batched together) and ``mixed``.

Writes a new ``benchmarks/results/gpu_density_<gpu>_<UTC time>.json`` (or
``--out``, an existing file only with ``--overwrite``: a committed result is
never replaced by accident); measures, asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from benchmarks import bench_server
from benchmarks.engine_log import busy_between, counters, handoffs, slot_gib
from benchmarks.gpu_checkpoint import synthetic_voice
from benchmarks.gpu_duplex import (
    GpuSampler,
    b64,
    chat_request,
    jpeg_b64,
    model_code,
    recv_until,
    run_saved,
    summary,
)
from benchmarks.gpu_profile import Sampler

REALTIME_P95_MS = 1000.0
CHUNK_S = 1.0
BARRIER_S = 20.0  # the longest a prepared session waits for the others to start


async def paced_session(
    base: str,
    index: int,
    units: int,
    listen_every: int,
    voice: Any,
    frames: list[str],
    start: Start,
) -> dict[str, Any]:
    """One omni session sending a unit every second from its place in
    ``start``; results are read as they come, each matched to its chunk
    through the dropped counts."""
    sid = f"density_{index}_{time.monotonic_ns()}"
    speech = synthetic_voice(float(units) + 1)
    sent_at: list[float] = []
    rows: list[dict[str, Any]] = []
    async with connect(f"{base}/ws/duplex/{sid}?mode=omni_duplex", max_size=None) as ws:
        await recv_until(ws, "queue_done", timeout=600)
        await ws.send(json.dumps({
            "type": "prepare", "system_prompt": "You are a helpful assistant.",
            "ref_audio_base64": b64(voice),
        }))  # fmt: skip
        await recv_until(ws, "prepared", timeout=120)

        first = await start.first_send(index)

        async def send() -> None:
            for k in range(units):
                await asyncio.sleep(max(0.0, first + k * CHUNK_S - time.perf_counter()))
                sent_at.append(time.perf_counter())
                await ws.send(json.dumps({
                    "type": "audio_chunk",
                    "audio_base64": b64(speech[k * 16000 : (k + 1) * 16000]),
                    "frame_base64_list": [frames[(index + k) % len(frames)]],
                    "force_listen": bool(listen_every) and k % listen_every == 0,
                }))  # fmt: skip

        sender = asyncio.create_task(send(), name=f"density-sender{index}")
        chunk = 0
        try:
            while chunk < units:
                result = await recv_until(ws, "result", timeout=60)
                chunk += int(result.get("dropped_chunks") or 0)
                if chunk >= units:
                    break
                rows.append({
                    "chunk": chunk,
                    "latency_ms": (time.perf_counter() - sent_at[chunk]) * 1000,
                    "wall_clock_ms": result.get("wall_clock_ms", 0.0),
                    "is_listen": result.get("is_listen", True),
                    "dropped": int(result.get("dropped_chunks") or 0),
                    "n_tts_tokens": result.get("n_tts_tokens", 0),
                    "kv_cache_length": result.get("kv_cache_length", 0),
                    "evicted_units": result.get("evicted_units", 0),
                    "sent_at": sent_at[chunk],
                })  # fmt: skip
                chunk += 1
        finally:
            await sender
        await ws.send(json.dumps({"type": "stop"}))
        await recv_until(ws, "stopped", timeout=60)
    return {"units": rows, "dropped": units - len(rows)}


class Start:
    """When each of ``n`` sessions sends its first chunk: once all are
    prepared, session k at k/n of a second later (``spread``: users' chunk
    boundaries fall anywhere in the second, independently), or all at that
    instant (``aligned``: every session's unit arrives together, the worst
    case for the batches' latency and the best for their size)."""

    def __init__(self, n: int, phases: str) -> None:
        self.n, self.phases = n, phases
        self.barrier = asyncio.Barrier(n)
        self.at: float | None = None
        self.begun = asyncio.Event()  # set with ``at``

    async def first_send(self, index: int) -> float:
        # A session queued behind the others (an engine of fewer slots than
        # n) never comes: the rest go on after a while, from then.
        with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
            await asyncio.wait_for(self.barrier.wait(), BARRIER_S)
        if self.at is None:
            self.at = time.perf_counter()
            self.begun.set()
        offset = index / self.n * CHUNK_S if self.phases == "spread" else 0.0
        return self.at + offset


class LevelMeter:
    """What the server spent at one level of load, from ``begin`` to ``end``:
    the worker's CPU seconds per second, GPU memory and busy share, and from
    the engine's log its thread hand-offs, its threads' busy time and the
    lanes' graphs (each level reads the log from where the last ended)."""

    def __init__(self, server_pid: int, log: Path, sampler: GpuSampler, idle_mib: float) -> None:
        self.server_pid, self.log, self.sampler, self.idle_mib = server_pid, log, sampler, idle_mib
        # Set by begin(): where the level's log starts, the counters and CPU then.
        self.log_at, self.busy_before, self.started, self.cpu_before = 0, {}, 0.0, {}

    def begin(self) -> None:
        text = self.log.read_text()
        self.log_at, (self.busy_before, _) = len(text), counters(text)
        self.sampler.peak_mib, self.sampler.busy_percent = 0.0, []
        self.started, self.cpu_before = time.perf_counter(), cpu_seconds(self.server_pid)

    async def end(self, run: dict[str, Any], n: int) -> dict[str, Any]:
        run["seconds"] = round(time.perf_counter() - self.started, 1)
        run["cpu_per_second"] = {
            name: round((spent - self.cpu_before.get(name, 0.0)) / run["seconds"], 2)
            for name, spent in cpu_seconds(self.server_pid).items()
        }
        await asyncio.sleep(1.0)  # the sessions' slots released and logged
        text = self.log.read_text()
        run["handoffs_per_unit"] = handoffs(text, self.log_at)
        busy_after, run["lane_graphs"] = counters(text)
        run["engine_busy"] = busy_between(self.busy_before, busy_after, run["seconds"])
        run["peak_mib"] = self.sampler.peak_mib
        run["gpu_busy_percent"] = self.sampler.mean_busy()
        run["mib_per_session_beyond_slots"] = round(
            max(0.0, self.sampler.peak_mib - self.idle_mib) / n, 1
        )
        return run


def chat_marks(requests: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    """Where chats' time went, each as a summary: the prompt in the context
    (its "prefill_done"), the first text chunk, the first audio."""
    marks = {}
    for mark in ("prefill_done", "first_chunk", "first_audio"):
        name = "chat_first_audio_ms" if mark == "first_audio" else f"chat_{mark}_ms"
        marks[name + suffix] = summary([c[f"{mark}_ms"] for c in requests if c[f"{mark}_ms"]])
    return marks


async def chat_rounds(
    base: str, voice: Any, args: argparse.Namespace, start: Start
) -> list[dict[str, Any]]:
    """Chats beside the mixed level's duplex sessions: ``--mixed-chats`` at
    once, a round after the last one's first audios and a second's pause,
    from the sessions' warm-up units' end until three seconds before their
    last unit."""
    await start.begun.wait()  # every session prepared: their units begin
    await asyncio.sleep((args.warmup_units + 1) * CHUNK_S)
    end = (start.at or 0.0) + (args.units - 3) * CHUNK_S
    chats: list[dict[str, Any]] = []
    first = functools.partial(chat_request, until_first_audio=True)
    while time.perf_counter() < end:
        index = 300 + len(chats)
        chats += await asyncio.gather(
            *(first(base, voice, index + i) for i in range(args.mixed_chats))
        )
        await asyncio.sleep(1.0)
    return chats


async def mixed_level(
    base: str,
    voice: Any,
    chat_voice: Any,
    frames: list[str],
    args: argparse.Namespace,
    meter: LevelMeter,
) -> dict[str, Any]:
    """``--mixed`` omni sessions with chats beside them (``chat_rounds``, in
    ``chat_voice``): the sessions' figures, and the chats' marks under that load."""
    meter.begin()
    start = Start(args.mixed, args.phases)
    sessions, chats = await asyncio.gather(
        asyncio.gather(*(
            paced_session(base, k, args.units, 3, voice, frames, start)
            for k in range(args.mixed)
        )),
        chat_rounds(base, chat_voice, args, start),
    )  # fmt: skip
    run = figures(list(sessions), args.warmup_units)
    run.update(chats_at_once=args.mixed_chats, chats=len(chats), **chat_marks(chats, ""))
    return await meter.end(run, args.mixed)


def figures(sessions: list[dict[str, Any]], warmup_units: int) -> dict[str, Any]:
    rows = [r for s in sessions for r in s["units"] if r["chunk"] >= warmup_units]
    speak = [r for r in rows if not r["is_listen"]]
    starts = [
        r
        for s in sessions
        for previous, r in zip(s["units"], s["units"][1:], strict=False)
        if not r["is_listen"] and previous["is_listen"] and r["chunk"] >= warmup_units
    ]
    return {
        "latency_ms": summary([r["latency_ms"] for r in rows]),
        "speak_latency_ms": summary([r["latency_ms"] for r in speak]),
        "speak_wall_clock_ms": summary([r["wall_clock_ms"] for r in speak]),
        "listen_wall_clock_ms": summary([r["wall_clock_ms"] for r in rows if r["is_listen"]]),
        "turn_start_latency_ms": summary([r["latency_ms"] for r in starts]),
        "speak_units": len(speak),
        "dropped_chunks": sum(s["dropped"] for s in sessions),
    }


def largest_realtime(runs: dict[str, dict[str, Any]]) -> int:
    """The largest N real time with every smaller N measured (p95 latency
    at most 1 s, no chunk dropped): a sweep whose N=12 fails and N=16
    passes (a slow start at one level) serves 8, not 16."""
    largest = 0
    for n in sorted(runs, key=int):
        run = runs[n]
        if run["latency_ms"].get("p95", 1e9) > REALTIME_P95_MS or run["dropped_chunks"]:
            break
        largest = int(n)
    return largest


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of the server (the gateway) and of
    each child (the workers), by name: a worker near one CPU second per
    second is bound by its interpreter lock, whatever its GPU does."""
    import psutil

    root = psutil.Process(pid)
    spent = {}
    for k, process in enumerate([root, *root.children(recursive=True)]):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            spent["gateway" if k == 0 else f"child {k}"] = times.user + times.system
    return spent


async def profile(args: argparse.Namespace, server_pid: int, n: int) -> None:
    """py-spy on the workers while ``n`` sessions run, from the end of their
    warm-up units to two seconds before their last (see gpu_profile.py)."""
    import psutil

    profiler = Sampler.find(args.profile_dir, args.py_spy)
    if profiler is None:
        print("no py-spy: no profile", flush=True)
        return
    await asyncio.sleep(args.warmup_units * CHUNK_S + 3.0)
    workers = [p.pid for p in psutil.Process(server_pid).children(recursive=True)]
    profiler.start(workers, max(2.0, args.units - args.warmup_units - 5.0), f"n{n}")
    await asyncio.sleep(args.units / 2)
    for pid in workers:
        await asyncio.to_thread(profiler.dump, pid, f"n{n}")
    await asyncio.to_thread(profiler.wait)


async def profile_chats(args: argparse.Namespace, server_pid: int) -> Sampler | None:
    """py-spy on the gateway and the workers for the 8 chats at once (their
    first audio comes within about a second; the recordings run for two)."""
    import psutil

    profiler = Sampler.find(args.profile_dir, args.py_spy)
    if profiler is None:
        print("no py-spy: no profile", flush=True)
        return None
    root = psutil.Process(server_pid)
    profiler.start([server_pid, *(p.pid for p in root.children(recursive=True))], 2, "chats8")
    await asyncio.sleep(0.5)  # py-spy attached before the chats start
    return profiler


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ckpt = args.model_path.resolve()
    port = bench_server.free_port()
    env = bench_server.server_env(
        ckpt,
        args.speak_tokens,
        OMNILIVE_MINICPMO__SLOTS=str(args.slots or max(args.counts)),
        OMNILIVE_MINICPMO__ENCODER_GRAPHS=str(args.encoder_graphs).lower(),
    )
    sampler = GpuSampler()
    report: dict[str, Any] = {
        "gpu": GpuSampler.query("name") or "no GPU",
        "chat_voice": "default" if args.chat_default_voice else "own",
        "model_code": model_code(ckpt),
        "speak_tokens_per_unit": args.speak_tokens,
        "units_per_session": args.units,
        "phases": args.phases,
        "encoder_graphs": args.encoder_graphs,
        "baseline_mib": sampler.used_mib(),
        "runs": {},
    }
    server, log = bench_server.start_server(args, ckpt, port, env)
    http, ws = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))

    sampler.start()
    try:
        report["load_s"] = round(await bench_server.wait_ready(http, server, args.load_timeout), 1)
        report["idle_mib"] = sampler.used_mib()
        report["slot_gib"] = slot_gib(args.log)
        voice = synthetic_voice(3.0)
        frames = [jpeg_b64(seed) for seed in range(8)]
        chat_voice = None if args.chat_default_voice else voice
        meter = LevelMeter(server.pid, args.log, sampler, report["idle_mib"])
        for n in args.counts:
            meter.begin()
            start = Start(n, args.phases)
            sessions = await asyncio.gather(
                *(paced_session(ws, k, args.units, 3, voice, frames, start) for k in range(n)),
                *([profile(args, server.pid, n)] if n in args.profile_at else []),
            )
            run = figures([s for s in sessions if s is not None], args.warmup_units)
            report["runs"][str(n)] = await meter.end(run, n)
            save()
            print(f"N={n}: {json.dumps(run)}", flush=True)
        report["max_realtime_sessions"] = largest_realtime(report["runs"])
        save()
        if args.chats:
            # Each request leaves once its first audio came: with random weights
            # an answer's speech would run for its whole token budget.
            first = functools.partial(chat_request, until_first_audio=True)
            await first(ws, chat_voice, 0, max_new_tokens=8)  # warm
            alone = [await first(ws, chat_voice, 1 + i) for i in range(args.chats)]
            # Eight at once twice: the first time the vocoder's lane meets the
            # shapes of eight first pieces together it runs them eagerly and
            # captures their graphs (reported apart); the second is the figure.
            at_once = await asyncio.gather(*(first(ws, chat_voice, 100 + i) for i in range(8)))
            # Their answers cancelled and their slots released first: without
            # this pause the second round's prompts all waited ~350 ms for the
            # first round's ending (issue35n's results).
            await asyncio.sleep(1.0)
            profiler = await profile_chats(args, server.pid) if args.profile_chats else None
            busy_before, started = counters(args.log.read_text())[0], time.perf_counter()
            together = await asyncio.gather(*(first(ws, chat_voice, 200 + i) for i in range(8)))
            if profiler is not None:
                await asyncio.to_thread(profiler.wait)
            seconds = time.perf_counter() - started
            await asyncio.sleep(1.0)  # the chats' slots released and logged
            report["chat_engine_busy_8_at_once"] = busy_between(
                busy_before, counters(args.log.read_text())[0], seconds
            )
            rounds = (("", alone), ("_8_at_once", together), ("_8_at_once_first", at_once))
            for suffix, requests in rounds:
                report.update(chat_marks(requests, suffix))
            save()
        if args.mixed:
            # Twice, as the chats: the first round meets the vocoder's batches
            # of duplex and chat pieces together (new shapes, eager runs and
            # captures on the side lane), reported apart; the second is the figure.
            for name in ("mixed_first", "mixed"):
                report[name] = await mixed_level(ws, voice, chat_voice, frames, args, meter)
                save()
                print(f"{name} N={args.mixed}: {json.dumps(report[name])}", flush=True)
    finally:
        sampler.stop()
        bench_server.stop_server(server, log)
    save()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", type=Path, required=True)
    # The defaults are issue 61's protocol (40 slots fit an H200's memory, not
    # an 80 GB card's): a run with no options is comparable with its results.
    parser.add_argument(
        "--counts",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 8, 16, 24, 32, 40],
        help="the levels: N sessions at once, in turn (N,M,...)",
    )
    parser.add_argument("--slots", type=int, help="minicpmo.slots (default: the largest count)")
    parser.add_argument("--units", type=int, default=14, help="units (seconds) a session sends")
    parser.add_argument("--warmup-units", type=int, default=2, help="left out of the figures")
    parser.add_argument("--speak-tokens", type=int, default=12)
    parser.add_argument(
        "--phases", choices=("spread", "aligned"), default="spread",
        help="sessions' first chunks k/N s apart, or all at once (see Start)",
    )  # fmt: skip
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument(
        "--mixed", type=int, default=8,
        help="after the chats, N duplex sessions with chats beside them (0: none)",
    )  # fmt: skip
    parser.add_argument("--mixed-chats", type=int, default=4, help="chats at once, each round")
    parser.add_argument(
        "--encoder-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the server's vision encoder and Whisper as CUDA graphs (minicpmo.encoder_graphs)",
    )
    parser.add_argument(
        "--profile-at", type=lambda s: [int(x) for x in s.split(",")], default=[],
        help="py-spy the workers while N sessions run (N,M,...)",
    )  # fmt: skip
    parser.add_argument(
        "--chat-default-voice", action="store_true",
        help="the chats speak in the server's default voice (prepared at the warm-up), "
        "not a reference voice of their own",
    )  # fmt: skip
    parser.add_argument(
        "--profile-chats", action="store_true", help="py-spy the server while 8 chats run at once"
    )
    parser.add_argument("--profile-dir", type=Path, default=Path("/tmp/omnilive-profile"))
    parser.add_argument("--py-spy", help="the py-spy program (default: on the path)")
    bench_server.add_server_arguments(
        parser, "gpu_density_server.log", "/tmp/omnilive-density-data"
    )
    return run_saved(parser, "gpu_density", bench, argv)


if __name__ == "__main__":
    raise SystemExit(main())
