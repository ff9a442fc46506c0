"""N omni duplex sessions at once over WebRTC, as the pages talk to the
server: each an aiortc peer with a microphone playing a voice and a 640x480
camera at 5 frames a second, on ``/api/webrtc/duplex/{id}?mode=omni_duplex``
of one ``omnilive serve`` with ``--media-processes`` media processes (issue 61).

The peers run in ``--client-processes`` processes of their own (an aiortc
peer with a camera takes a tenth of a core or more, in one interpreter each),
all set up and prepared before a level starts. A unit's latency is from the
end of its second of microphone audio, as the peer captured it, to its
``result`` on the data channel. The gateway cuts a call's audio into whole
seconds from the track's first sample, and the results name their unit, so
unit k of a call ends at ``start + m0 + k + 1`` seconds of its microphone's
clock; the first unit the session took (m0, the seconds before ``prepared``)
is read off the results as the whole seconds no unit's latency can be below
(the server's own time of each unit, ``wall_clock_ms``, is a floor; the
transport's part below a second, as on one host). What WebRTC adds is then
each unit's latency less its server time (``added_ms``: Opus, the jitter
buffer, the media process, the data channel), set beside the WebSocket's in
``gpu_density`` (the same less from the chunk's send).

Real time at a level: unit latency p95 <= 1 s, nothing dropped (the
worker's ``dropped_chunks`` and the results missing), every call answered.

    python -m benchmarks.gpu_density_webrtc --model-path CKPT [--counts 8,16,32]
        [--units 14] [--slots 32] [--media-processes 4] [--client-processes 8] [--out F]
    python -m benchmarks.gpu_density_webrtc --engine scripted --model-path CKPT --counts 2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import multiprocessing
import os
import time
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from benchmarks import bench_server
from benchmarks.gpu_checkpoint import synthetic_voice
from benchmarks.gpu_duplex import GpuSampler, run_saved
from benchmarks.load import percentile
from benchmarks.webrtc_transport import cpu_s

CAMERA = (640, 480)
WARMUP_UNITS = 2  # left out of the figures, as gpu_density's


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    at = {f"p{q}": round(percentile(values, q), 1) for q in (50, 95, 99)}
    return {"n": len(values), **at, "max": round(max(values), 1)}


def unit_latencies(mic_start: float, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each result's latency from the end of its second of microphone audio
    (see the module): m0, the seconds before the session's first unit, is
    the largest whole number of seconds that leaves no unit's latency below
    its server time. ``results`` are the events with ``arrived`` (monotonic
    seconds) added."""
    rows = [r for r in results if isinstance(r.get("unit_index"), int)]
    if not rows:
        return []
    slack = [
        r["arrived"] - mic_start - (r["unit_index"] + 1) - float(r.get("wall_clock_ms") or 0) / 1000
        for r in rows
    ]
    m0 = math.floor(min(slack))
    out = []
    for r in rows:
        latency_ms = (r["arrived"] - mic_start - (m0 + r["unit_index"] + 1)) * 1000
        wall = float(r.get("wall_clock_ms") or 0)
        out.append({
            "unit": r["unit_index"],
            "latency_ms": latency_ms,
            "wall_clock_ms": wall,
            "added_ms": latency_ms - wall,
            "is_listen": bool(r.get("is_listen", True)),
            "dropped": int(r.get("dropped_chunks") or 0),
        })  # fmt: skip
    return out


async def one_call(http: str, index: int, voice_b64: str, units: int,
                   ready: asyncio.Event, go: asyncio.Event) -> dict[str, Any]:  # fmt: skip
    """One call: prepared, then (at ``go``) ``units`` seconds of a voice on
    its microphone; its results with their arrival times."""
    from tests.webrtc_peer import Peer

    peer = Peer(channel="events", camera=CAMERA)
    results: list[dict[str, Any]] = []

    def arrived(data: str) -> None:
        event = json.loads(data)
        if isinstance(event, dict) and event.get("type") == "result":
            event.pop("audio_data", None)
            results.append({**event, "arrived": time.monotonic()})

    peer.channel.on("message", arrived)
    sid = f"rtc_density_{index}_{time.monotonic_ns()}"
    try:
        response = await peer.call(f"{http}/api/webrtc/duplex/{sid}?mode=omni_duplex")
        response.raise_for_status()
        await peer.opened.wait()
        peer.send({"type": "prepare", "system_prompt": "You are a helpful assistant.",
                   "ref_audio_base64": voice_b64})  # fmt: skip
        await peer.until("prepared", timeout=120)
        ready.set()
        await go.wait()
        peer.mic.play(synthetic_voice(float(units) + 1))
        taken = len(results)
        deadline = time.monotonic() + units + 30
        while time.monotonic() < deadline:
            if len(results) - taken >= units or peer.closed.is_set():
                break
            await asyncio.sleep(0.2)
        peer.send({"type": "stop"})
        with contextlib.suppress(TimeoutError):
            await peer.until("stopped", timeout=30)
        return {
            "units": unit_latencies(peer.mic.started_at or 0.0, results),
            "sounded": peer.sounded.is_set(),
            "error": None,
        }
    except Exception as exc:  # one call's failure is a figure, not the run's end
        ready.set()
        return {"units": [], "sounded": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        await peer.close()


async def client_group(http: str, indices: list[int], voice_b64: str, units: int,
                       ready: Any, go: MpEvent) -> list[dict[str, Any]]:  # fmt: skip
    marks = [asyncio.Event() for _ in indices]
    start = asyncio.Event()
    calls = [asyncio.create_task(one_call(http, k, voice_b64, units, mark, start),
                                 name=f"rtc-density-call{k}")
             for k, mark in zip(indices, marks, strict=True)]  # fmt: skip
    for mark in marks:
        await mark.wait()
    ready.put(len(indices))
    await asyncio.to_thread(go.wait)
    start.set()
    return await asyncio.gather(*calls)


def run_client_group(http: str, indices: list[int], voice_b64: str, units: int,
                     ready: Any, go: MpEvent, out: Any) -> None:  # fmt: skip
    """A client process: its calls, their rows put on ``out``."""
    out.put(asyncio.run(client_group(http, indices, voice_b64, units, ready, go)))


def level(
    http: str, server_pid: int, n: int, args: argparse.Namespace, voice_b64: str
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """``n`` calls over ``--client-processes`` processes: every call's rows,
    and the server's cores by kind from the calls' start to their end."""
    context = multiprocessing.get_context("spawn")
    ready, out, go = context.Queue(), context.Queue(), context.Event()
    groups = [list(range(n))[k :: args.client_processes] for k in range(args.client_processes)]
    groups = [group for group in groups if group]
    processes = [
        context.Process(target=run_client_group,
                        args=(http, group, voice_b64, args.units, ready, go, out))
        for group in groups
    ]  # fmt: skip
    for process in processes:
        process.start()
    prepared = 0
    deadline = time.monotonic() + 600
    while prepared < n and time.monotonic() < deadline:
        prepared += ready.get(timeout=max(1.0, deadline - time.monotonic()))
    before, started = cpu_by_process(server_pid), time.monotonic()
    go.set()
    calls = []
    for _ in processes:
        calls += out.get(timeout=args.units + 120)
    seconds = time.monotonic() - started
    cores = {
        kind: round((spent - before.get(kind, 0.0)) / seconds, 2)
        for kind, spent in cpu_by_process(server_pid).items()
    }
    for process in processes:
        process.join(30)
    return calls, cores


def figures(calls: list[dict[str, Any]], units: int) -> dict[str, Any]:
    rows = [r for call in calls for r in call["units"] if r["unit"] >= WARMUP_UNITS]
    missing = sum(max(0, units - len(call["units"])) for call in calls)
    latency = percentiles([r["latency_ms"] for r in rows])
    dropped = sum(r["dropped"] for r in rows) + missing
    return {
        "latency_ms": latency,
        "wall_clock_ms": percentiles([r["wall_clock_ms"] for r in rows]),
        "added_ms": percentiles([r["added_ms"] for r in rows]),
        "speak_latency_ms": percentiles([r["latency_ms"] for r in rows if not r["is_listen"]]),
        "dropped_chunks": dropped,
        "calls_sounded": sum(call["sounded"] for call in calls),
        "errors": [call["error"] for call in calls if call["error"]],
        "real_time": bool(rows) and latency["p95"] <= 1000 and not dropped
        and not any(call["error"] for call in calls),
    }  # fmt: skip


def cpu_by_process(pid: int) -> dict[str, float]:
    """CPU seconds so far of the gateway and of its descendants, by kind
    (media processes, workers), read from /proc."""
    spent: dict[str, float] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            line = Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ")
            seconds = cpu_s(current)
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue  # it just ended
        kind = ("gateway" if current == pid else "media" if b"media_process" in line
                else "worker" if b"worker" in line else "other")  # fmt: skip
        spent[kind] = spent.get(kind, 0.0) + seconds
        todo += map(int, children)
    return spent


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ckpt = args.model_path.resolve()
    port = bench_server.free_port()
    slots = str(args.slots or max(args.counts))
    env = bench_server.server_env(
        ckpt, args.speak_tokens,
        OMNILIVE_MINICPMO__SLOTS=slots, OMNILIVE_SCRIPTED__SLOTS=slots,
        OMNILIVE_WEBRTC__MEDIA_PROCESSES=str(args.media_processes),
        OMNILIVE_WEBRTC__MAX_PEER_CONNECTIONS=str(max(64, max(args.counts))),
    )  # fmt: skip
    report: dict[str, Any] = {
        "gpu": GpuSampler.query("name") or "no GPU",
        "engine": args.engine,
        "transport": "webrtc",
        "units_per_session": args.units,
        "media_processes": args.media_processes,
        "client_processes": args.client_processes,
        "host_cpus": os.cpu_count(),
        "runs": {},
    }
    server, log = bench_server.start_server(args, ckpt, port, env)
    http = f"http://127.0.0.1:{port}"
    voice = synthetic_voice(3.0)
    voice_b64 = base64.b64encode(voice.astype("<f4").tobytes()).decode()
    try:
        report["load_s"] = round(await bench_server.wait_ready(http, server, args.load_timeout), 1)
        for n in args.counts:
            calls, cores = await asyncio.to_thread(level, http, server.pid, n, args, voice_b64)
            run = {**figures(calls, args.units), "cores": cores}
            report["runs"][str(n)] = run
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2))
            print(f"N={n}: {json.dumps(run)}", flush=True)
            await asyncio.sleep(2.0)  # the calls' slots given back
        real = [int(n) for n, run in report["runs"].items() if run["real_time"]]
        report["max_realtime_sessions"] = max(real, default=0)
        args.out.write_text(json.dumps(report, indent=2))
        return report
    finally:
        bench_server.stop_server(server, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--counts", type=lambda s: [int(x) for x in s.split(",")],
                        default=[8, 16, 32], help="calls at once, a level each")  # fmt: skip
    parser.add_argument("--slots", type=int, help="minicpmo.slots (default: the largest count)")
    parser.add_argument("--units", type=int, default=14, help="seconds each call speaks")
    parser.add_argument("--speak-tokens", type=int, default=12)
    parser.add_argument("--media-processes", type=int, default=4)
    parser.add_argument("--client-processes", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    bench_server.add_server_arguments(
        parser, "gpu_density_webrtc_server.log", "/tmp/omnilive-density-webrtc-data"
    )
    return run_saved(parser, "gpu_density_webrtc", bench, argv)


if __name__ == "__main__":
    raise SystemExit(main())
