"""How the gateway's WebRTC media side scales: the CPU per call of the
gateway and of its media processes (``webrtc.media_processes``), for N calls
at once run in the gateway's own process (0 media processes) against K media
processes, on the scripted engine.

For each K in ``--media-processes`` it starts ``omnilive serve`` with that
many media processes (and as many scripted slots as the largest N), then for
each N in ``--calls`` opens N calls from aiortc peers in this process, all
set up before the window starts, and has each speak the same question
(espeak-ng) with its microphone open for ``--window-s``: OpenAI's GA
dialect answered on the track (``--mode audio``), or omni duplex with a
640x360 camera at 5 frames a second, as the pages send it (``--mode omni``).
CPU seconds of every process over the window (from /proc), divided by the
window, are cores; divided by N, cores per call. The peers run on the same
machine, so on a small host they take cores the server would use; their
own CPU is saved beside. Prints a table and saves
benchmarks/results/webrtc_media_scale_<machine>.json.

    python -m benchmarks.webrtc_media_scale [--calls 1,2,4] [--media-processes 0,1]
        [--mode audio|omni] [--window-s 9] [--machine NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from tests.speech import silence, speak
from tests.webrtc_peer import Peer, media_pids

from benchmarks.load import save_result, this_machine
from benchmarks.webrtc_transport import QUESTION, SESSION, cpu_s

CAMERA = (640, 360)  # the omni page's frames, at 5 a second


def worker_pids(server: Server) -> list[int]:
    assert server.process is not None
    pid = server.process.pid
    found = []
    for child in map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
        if b"worker" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
            found.append(child)
    return found


def cpu_of(pids: list[int]) -> float:
    return sum(cpu_s(pid) for pid in pids)


async def until_media_ready(server: Server, count: int, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while True:
            config = await server.get("/api/webrtc/config")
            if config.get("media_ready", 0) >= count:
                return
            await asyncio.sleep(0.1)


async def set_up(server: Server, mode: str, index: int) -> Peer:
    """One call, its session ready to hear the question."""
    if mode == "audio":
        peer = Peer(jitter_packets=1)
        response = await peer.call(f"{server.http}/v1/realtime/calls?model=omnilive-realtime")
        response.raise_for_status()
        await peer.until("session.created")
        peer.send({"type": "session.update", "session": SESSION})
        await peer.until("session.updated")
        return peer
    peer = Peer(channel="events", camera=CAMERA)  # its video receiver has no track to tune
    url = f"{server.http}/api/webrtc/duplex/scale_{index}_{time.monotonic_ns()}?mode=omni_duplex"
    response = await peer.call(url)
    response.raise_for_status()
    await peer.opened.wait()
    peer.send({"type": "prepare", "system_prompt": "Be brief."})
    await peer.until("prepared", timeout=60)
    return peer


def answered(peer: Peer, mode: str) -> bool:
    kinds = peer.kinds()
    if mode == "audio":
        return "response.done" in kinds and peer.sounded.is_set()
    return kinds.count("result") >= 3 and peer.sounded.is_set()


async def level(server: Server, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """``n`` calls at once: each process's cores over the window."""
    speech = np.concatenate([silence(0.5), speak(QUESTION)])
    peers = await asyncio.gather(*(set_up(server, args.mode, k) for k in range(n)))
    try:
        assert server.process is not None
        groups = {
            "gateway": [server.process.pid],
            "media": media_pids(server),
            "workers": worker_pids(server),
            "clients": [os.getpid()],
        }
        before = {name: cpu_of(pids) for name, pids in groups.items()}
        t0 = time.monotonic()
        for peer in peers:
            peer.mic.play(speech)
        await asyncio.sleep(args.window_s)
        wall = time.monotonic() - t0
        cores = {name: (cpu_of(pids) - before[name]) / wall for name, pids in groups.items()}
        done = sum(answered(peer, args.mode) for peer in peers)
    finally:
        await asyncio.gather(*(peer.close() for peer in peers))
    media_side = cores["gateway"] + cores["media"]
    row = {
        "calls": n,
        "answered": done,
        "window_s": round(wall, 2),
        "cores": {name: round(value, 3) for name, value in cores.items()},
        "gateway_cores_per_call": round(cores["gateway"] / n, 4),
        "media_cores_per_call": round(cores["media"] / n, 4),
        "gateway_and_media_cores_per_call": round(media_side / n, 4),
    }
    await server.wait_idle(timeout=30)
    return row


async def run_config(args: argparse.Namespace, media: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "OMNILIVE_SCRIPTED__SLOTS": str(max(args.calls)),
            "OMNILIVE_WEBRTC__MEDIA_PROCESSES": str(media),
            "OMNILIVE_WEBRTC__MAX_PEER_CONNECTIONS": str(max(64, max(args.calls))),
        }
        server = Server(Path(tmp), engine=args.engine, env=env).start()
        try:
            await server.wait_ready(timeout=300, workers=1)
            await until_media_ready(server, media)
            rows = []
            for n in args.calls:
                rows.append(await level(server, args, n))
                print({"media_processes": media, **rows[-1]})
        finally:
            server.stop()
    return {"media_processes": media, "levels": rows}


def table(configs: list[dict[str, Any]]) -> str:
    lines = ["K  calls  answered  gateway/call  media/call  both/call  gateway cores"]
    for config in configs:
        for row in config["levels"]:
            lines.append(
                f"{config['media_processes']:<3}{row['calls']:<7}{row['answered']:<10}"
                f"{row['gateway_cores_per_call']:<14}{row['media_cores_per_call']:<12}"
                f"{row['gateway_and_media_cores_per_call']:<11}{row['cores']['gateway']}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="scripted")
    parser.add_argument("--calls", default="1,2,4", help="calls at once, a level each")
    parser.add_argument("--media-processes", default="0,1", help="K per server run; 0: in-process")
    parser.add_argument("--mode", choices=("audio", "omni"), default="audio")
    parser.add_argument("--window-s", type=float, default=9.0, help="microphone open per call")
    parser.add_argument("--machine", default=f"{os.cpu_count()}core", help="the results' suffix")
    args = parser.parse_args()
    args.calls = [int(n) for n in args.calls.split(",") if n]
    kinds = [int(k) for k in args.media_processes.split(",") if k]
    configs = [asyncio.run(run_config(args, media)) for media in kinds]
    result = {
        "benchmark": "webrtc_media_scale",
        "engine": args.engine,
        "mode": args.mode,
        "host": platform.node(),
        "machine": this_machine(),
        "window_s": args.window_s,
        "question": QUESTION,
        "configs": configs,
    }
    print(table(configs))
    machine = re.sub(r"[^A-Za-z0-9_.-]+", "_", args.machine)
    suffix = "" if args.mode == "audio" else "_omni"
    save_result(f"webrtc_media_scale_{machine}{suffix}", result)


if __name__ == "__main__":
    main()
