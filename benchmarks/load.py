"""How many live duplex sessions one gateway relays on this machine, and what it adds.

Starts ``omnilive serve --engine scripted`` (workers with enough slots for every
session) and opens N duplex sessions through the gateway, each sending one
second of audio per second, at real-time pace, for the whole run; the scripted
engine answers every chunk with a ``result`` (listen, or speak with a second of
24 kHz audio, as ``duplex_schedule`` says). It measures:

  relay delay   client receive time − the worker's ``server_send_ts`` of each
                result (one machine, one clock): what the worker's writer, the
                gateway and the sockets add between the worker and the client
  gateway       the gateway process's CPU (% of one core) and resident memory
                over time, from /proc; its own ``omnilive_relay_latency_seconds``
  errors        every ``error`` message or unexpected close (must be 0)

With several ``--sessions`` values it runs each in turn and reports the largest
N whose p99 relay delay stays under ``--p99-ms`` with no error. Results go to
benchmarks/results/load_<name>.json.

With ``--gateways K [K ...]`` each level runs on a local Ray cluster instead
(``serve --ray`` with ``--workers`` CPU worker actors, plus K − 1 ``gateway
--ray``), once per K, the sessions spread evenly over the K gateways: the
same total load through one gateway and through several that share one queue.
The gateway CPU is then the sum over the K gateways, with each one's share.

    python -m benchmarks.load --sessions 8 16 32 --minutes 1 [--omni] [--workers 2]
    python -m benchmarks.load --sessions 128 --gateways 1 2 --minutes 2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import math
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image
from tests.servers import Server
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

RESULTS = Path(__file__).parent / "results"
_TYPE = re.compile(r'\{"type": ?"([^"]+)"')
_SEND_TS = re.compile(r'"server_send_ts": ?([0-9]+)')
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# CPUs each worker actor reserves on the benchmark's cluster (OMNILIVE_RAY__WORKER_CPUS).
RAY_WORKER_CPUS = 1.0


def this_machine() -> dict[str, Any]:
    """What a CPU figure was measured on."""
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def save_result(name: str, result: dict[str, Any]) -> Path:
    """``result`` as benchmarks/results/<name>.json (said on stdout), dated
    (a ``when`` field) unless it carries a date of its own."""
    result = {"when": time.strftime("%Y-%m-%dT%H:%M:%S"), **result}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {path}")
    return path


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else math.nan


@dataclass
class Tally:
    """What the clients saw (shared by every session of a run)."""

    measure_from: float = 0.0  # monotonic; results before it are the warm-up
    delays_ms: list[float] = field(default_factory=list)
    results: int = 0
    speak_results: int = 0
    errors: list[str] = field(default_factory=list)
    sessions_done: int = 0
    loop_lag_ms: list[float] = field(default_factory=list)


def chunk_message(omni: bool) -> str:
    audio = base64.b64encode((np.full(16000, 0.01, "<f4")).tobytes()).decode()
    message: dict[str, Any] = {"type": "audio_chunk", "audio_base64": audio}
    if omni:
        buffer = io.BytesIO()
        Image.new("RGB", (448, 448), (30, 90, 160)).save(buffer, "JPEG", quality=85)
        message["frame_base64_list"] = [base64.b64encode(buffer.getvalue()).decode()]
    return json.dumps(message)


async def _receive(ws: ClientConnection, tally: Tally, stopped: asyncio.Event) -> None:
    try:
        async for raw in ws:
            now_ms = time.time() * 1000
            text = raw if isinstance(raw, str) else raw.decode()
            match = _TYPE.match(text)
            kind = match.group(1) if match else "?"
            if kind == "result":
                stamp = _SEND_TS.search(text, max(0, len(text) - 1024))
                if stamp and time.monotonic() >= tally.measure_from:
                    tally.delays_ms.append(now_ms - int(stamp.group(1)))
                tally.results += 1
                tally.speak_results += '"is_listen": false' in text[:64]
            elif kind == "error":
                tally.errors.append(text[:300])
            elif kind == "stopped":
                stopped.set()
                return
    except ConnectionClosed as exc:
        if not stopped.is_set():
            tally.errors.append(f"connection closed: {exc}")


async def run_session(url: str, chunk: str, start_at: float, stop_at: float, tally: Tally) -> None:
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    async with connect(url, max_size=None, compression=None) as ws:
        while json.loads(await ws.recv())["type"] != "queue_done":
            pass
        await ws.send(json.dumps({"type": "prepare", "system_prompt": "load test"}))
        while (message := json.loads(await ws.recv()))["type"] != "prepared":
            if message["type"] == "error":
                tally.errors.append(json.dumps(message))
                return
        stopped = asyncio.Event()
        reader = asyncio.create_task(_receive(ws, tally, stopped), name="load-reader")
        try:
            began = time.monotonic()
            k = 0
            while (due := began + k) < stop_at and not reader.done():
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await ws.send(chunk)
                k += 1
            await ws.send(json.dumps({"type": "stop"}))
            await asyncio.wait_for(stopped.wait(), 15)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    tally.sessions_done += 1


async def loop_lag(tally: Tally, until: float) -> None:
    """How late the client's own event loop wakes (if large, the client is the bottleneck)."""
    while time.monotonic() < until:
        before = time.monotonic()
        await asyncio.sleep(0.1)
        tally.loop_lag_ms.append((time.monotonic() - before - 0.1) * 1000)


def proc_sample(pid: int) -> tuple[float, int]:
    """(cpu seconds, rss bytes) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


async def worker_pids(server: Server) -> list[int]:
    """The workers' processes (children of ``serve``, or Ray actors)."""
    return [w["pid"] for w in (await server.get("/workers"))["workers"] if w["pid"]]


@contextlib.asynccontextmanager
async def deployment(
    args: argparse.Namespace, gateways: int | None, env: dict[str, str], tmp: Path
) -> AsyncIterator[list[Server]]:
    """The gateways to load: one ``omnilive serve`` (``gateways`` None), or a
    deployment of ``gateways`` gateways on a local Ray cluster."""
    workers = args.workers
    if gateways is None:
        server = Server(tmp, workers=workers, env=env).start()
        try:
            await server.wait_ready(workers=workers, timeout=120)
            yield [server]
        finally:
            server.stop()
        return
    from tests.cluster.local import ray_env, start_cluster

    cpus = math.ceil(workers * RAY_WORKER_CPUS) + 2
    cluster = start_cluster(tmp, ray_env(**env, OMNILIVE_RAY__WORKER_GPUS="0"), cpus=cpus)
    try:
        servers = [cluster.gateway("serve", workers=workers)]
        await servers[0].wait_ready(workers=workers, timeout=120)  # the deployment is up
        servers += [cluster.gateway("gateway") for _ in range(gateways - 1)]
        for server in servers[1:]:
            await server.wait_ready(workers=workers, timeout=120)
        yield servers
    finally:
        cluster.stop()


async def watch(
    pids: list[int], workers: list[int], until: float, every_s: float, tally: Tally
) -> list[dict[str, Any]]:
    """Every ``every_s``: the gateways' CPU (together and each) and memory, the
    workers' CPU, and the relay delay of the results received in that window."""
    samples = []
    seen = 0
    started = time.monotonic()
    last = {pid: proc_sample(pid)[0] for pid in pids + workers}
    last_t = started
    while time.monotonic() < until:
        await asyncio.sleep(every_s)
        now = time.monotonic()
        current = {pid: proc_sample(pid) for pid in pids + workers}

        def pct(pid: int) -> float:
            return 100 * (current[pid][0] - last[pid]) / (now - last_t)  # noqa: B023

        each = [round(pct(pid), 1) for pid in pids]
        window, seen = tally.delays_ms[seen:], len(tally.delays_ms)
        samples.append({
            "t_s": round(now - started, 1),
            "gateway_cpu_pct": round(sum(each), 1),
            "gateway_cpu_pct_each": each,
            "gateway_rss_mb": round(sum(current[pid][1] for pid in pids) / 2**20, 1),
            "workers_cpu_pct": round(sum(pct(pid) for pid in workers), 1),
            "relay_p99_ms": round(percentile(window, 99), 2) if window else None,
        })  # fmt: skip
        last = {pid: sample[0] for pid, sample in current.items()}
        last_t = now
    return samples


async def gateway_relay_quantiles(server: Server) -> dict[str, Any]:
    """The gateway's own histogram of worker stamp → handed to the client socket."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{server.http}/metrics", timeout=10)).text
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith('omnilive_relay_latency_seconds_bucket{mode="duplex"'):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0

    def upper(q: float) -> float | None:
        return next((le * 1000 for le, n in buckets if n >= q * total), None) if total else None

    return {"count": total, "p50_le_ms": upper(0.5), "p99_le_ms": upper(0.99)}


def slope_mb_per_min(samples: list[dict[str, float]]) -> float:
    """Memory trend over the second half of the run (the first half warms up)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return math.nan
    t = np.array([s["t_s"] for s in half]) / 60
    rss = np.array([s["gateway_rss_mb"] for s in half])
    return float(np.polyfit(t, rss, 1)[0])


async def run_level(
    args: argparse.Namespace, sessions: int, gateways: int | None = None
) -> dict[str, Any]:
    workers = args.workers
    slots = math.ceil(sessions / workers)
    env = {
        "OMNILIVE_SCRIPTED__SLOTS": str(slots),
        "OMNILIVE_SCRIPTED__DUPLEX_SCHEDULE": args.schedule,
        "OMNILIVE_DUPLEX__IDLE_TIMEOUT_S": "30",
        "OMNILIVE_RECORDING__ENABLED": "false",
        "OMNILIVE_LOG_LEVEL": "warning",
    }
    with tempfile.TemporaryDirectory() as tmp:
        async with deployment(args, gateways, env, Path(tmp)) as servers:
            now = time.monotonic()
            tally = Tally(measure_from=now + 1 + args.warmup_s)
            chunk = chunk_message(args.omni)
            mode = "omni" if args.omni else "audio"
            ramp = min(1.0, 0.02 * sessions)  # spread the sessions' phases over a second
            stop_at = now + 2 + args.minutes * 60
            tasks = [
                run_session(
                    f"{servers[i % len(servers)].ws}/ws/duplex/load{i}?mode={mode}",
                    chunk,
                    now + ramp * i / sessions,
                    stop_at,
                    tally,
                )
                for i in range(sessions)
            ]
            pids = [server.process.pid for server in servers if server.process is not None]
            watched = await worker_pids(servers[0])
            watcher = asyncio.create_task(
                watch(pids, watched, stop_at, args.sample_s, tally), name="load-watcher"
            )
            lag = asyncio.create_task(loop_lag(tally, stop_at), name="load-loop-lag")
            client_cpu = sum(os.times()[:2])
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            client_cpu = sum(os.times()[:2]) - client_cpu
            samples = await watcher
            await lag
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    tally.errors.append(f"session failed: {outcome!r}")
            gateway_view = [await gateway_relay_quantiles(server) for server in servers]
    delays = tally.delays_ms
    cpu = [s["gateway_cpu_pct"] for s in samples]
    windows = [s["relay_p99_ms"] for s in samples if s["relay_p99_ms"] is not None]
    rss = [s["gateway_rss_mb"] for s in samples]
    each = [s["gateway_cpu_pct_each"] for s in samples]
    return {
        "sessions": sessions,
        "gateways": gateways,
        "on_ray": gateways is not None,
        "workers": workers,
        "slots_per_worker": slots,
        "minutes": args.minutes,
        "mode": "omni" if args.omni else "audio",
        "results": tally.results,
        "speak_results": tally.speak_results,
        "sessions_completed": tally.sessions_done,
        "protocol_errors": len(tally.errors),
        "error_samples": tally.errors[:5],
        "relay_ms": {
            "p50": round(percentile(delays, 50), 2),
            "p90": round(percentile(delays, 90), 2),
            "p99": round(percentile(delays, 99), 2),
            "max": round(max(delays), 2) if delays else None,
            "mean": round(statistics.fmean(delays), 2) if delays else None,
        },
        "relay_p99_ms_per_window": {
            "median": round(statistics.median(windows), 2) if windows else None,
            "windows_over_limit": sum(w >= args.p99_ms for w in windows),
            "windows": len(windows),
        },
        "gateway_relay_histogram": gateway_view,
        "client_loop_lag_ms_p99": round(percentile(tally.loop_lag_ms, 99), 2),
        # The load generator shares the machine's cores with the gateway and workers.
        "client_cpu_pct_mean": round(100 * client_cpu / (args.minutes * 60 + 2), 1),
        "gateway_cpu_pct": {
            "mean": round(statistics.fmean(cpu), 1) if cpu else None,
            "max": max(cpu) if cpu else None,
            # one mean per gateway: each carries its share of the sessions
            "each_mean": [round(statistics.fmean(g), 1) for g in zip(*each, strict=True)]
            if each
            else [],
        },
        "gateway_rss_mb": {
            "first": rss[0] if rss else None,
            "last": rss[-1] if rss else None,
            "max": max(rss) if rss else None,
            "slope_second_half_mb_per_min": round(slope_mb_per_min(samples), 3),
        },
        "workers_cpu_pct_mean": round(statistics.fmean(s["workers_cpu_pct"] for s in samples), 1)
        if samples
        else None,
        "samples": samples,
    }


def summary_line(level: dict[str, Any]) -> str:
    relay = level["relay_ms"]
    where = f"K={level['gateways']} on Ray  " if level["gateways"] else ""
    return (
        f"{where}N={level['sessions']:>3}  results {level['results']:>6}  errors "
        f"{level['protocol_errors']}  relay p50 {relay['p50']:.2f} ms  p99 {relay['p99']:.2f} ms"
        f"  gateway CPU {level['gateway_cpu_pct']['mean']}%"
        f" (max {level['gateway_cpu_pct']['max']}%, each {level['gateway_cpu_pct']['each_mean']})"
        f"  RSS {level['gateway_rss_mb']['first']}→{level['gateway_rss_mb']['last']} MB"
        f"  client lag p99 {level['client_loop_lag_ms_p99']} ms"
        f"  windows over the limit {level['relay_p99_ms_per_window']['windows_over_limit']}"
        f"/{level['relay_p99_ms_per_window']['windows']}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--minutes", type=float, default=1.0, help="T: length of each run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--omni", action="store_true", help="one 448x448 JPEG per chunk too")
    parser.add_argument("--schedule", default="LLSSSE", help="scripted listen/speak plan")
    parser.add_argument("--p99-ms", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--name", default=None, help="results file suffix")
    parser.add_argument(
        "--gateways",
        type=int,
        nargs="+",
        metavar="K",
        help="run each level on a local Ray cluster through K gateways, for each K given",
    )
    args = parser.parse_args()
    levels = []
    for sessions in args.sessions:
        for gateways in args.gateways or [None]:
            level = await run_level(args, sessions, gateways)
            print(summary_line(level), flush=True)
            levels.append(level)
    passing = [
        lv["sessions"]
        for lv in levels
        if lv["protocol_errors"] == 0 and lv["relay_ms"]["p99"] < args.p99_ms
    ]
    report = {
        "largest_n_under_p99": max(passing) if passing else None,
        "p99_limit_ms": args.p99_ms,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "levels": levels,
    }
    RESULTS.mkdir(exist_ok=True)
    name = args.name or ("omni" if args.omni else "audio")
    if args.gateways and not args.name:
        name += "_gateways_" + "_".join(map(str, args.gateways))
    out = RESULTS / f"load_{name}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"largest N with p99 < {args.p99_ms:g} ms and no error: {report['largest_n_under_p99']}")
    print(f"saved {out}")


if __name__ == "__main__":
    asyncio.run(main())
