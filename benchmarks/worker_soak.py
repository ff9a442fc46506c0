"""Does a worker's memory grow without bound under floods of tiny messages?

An adversarial run saw a scripted worker grow from 75 to 166 MB over floods of
10,000 tiny messages and stay there. This soak repeats such floods for many
rounds against ``omnilive serve --engine scripted`` and samples the worker's
and the gateway's resident memory after each round: memory that levels off
is the allocators' high-water mark (pages Python and glibc keep for reuse);
memory that keeps rising round after round is a leak.

Each round opens a half-duplex and a duplex session through the gateway, sends
each ``--messages`` tiny messages as fast as the socket takes them (10 ms
audio chunks, with an unknown type and a malformed chunk among them, so that
the worker's refusals are exercised too), stops them, and waits for the
worker to settle. Results go to benchmarks/results/worker_soak.json.

    python -m benchmarks.worker_soak --rounds 30 --messages 10000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from websockets.asyncio.client import ClientConnection, connect

from benchmarks.load import proc_sample, save_result, worker_pids

TINY_AUDIO = base64.b64encode(np.zeros(160, "<f4").tobytes()).decode()  # 10 ms at 16 kHz
MB = 1024 * 1024


def flood(count: int) -> list[str]:
    """``count`` tiny messages: audio chunks, one in 50 refused by the worker."""
    chunk = json.dumps({"type": "audio_chunk", "audio_base64": TINY_AUDIO})
    odd = [json.dumps({"type": "no_such_type"}), json.dumps({"type": "audio_chunk"})]
    return [odd[(n // 50) % 2] if n % 50 == 49 else chunk for n in range(count)]


async def drain(ws: ClientConnection) -> int:
    """Read until the session's end; the number of messages received."""
    received = 0
    async for raw in ws:
        received += 1
        kind = json.loads(raw).get("type")
        if kind in ("stopped", "timeout"):
            break
    return received


async def one_session(server: Server, path: str, messages: list[str]) -> dict[str, int]:
    async with connect(f"{server.ws}{path}", max_size=None) as ws:
        await ws.send(json.dumps({"type": "prepare"}))
        while json.loads(await ws.recv()).get("type") != "prepared":
            pass
        reader = asyncio.create_task(drain(ws), name=f"soak-reader{path}")
        for message in messages:
            await ws.send(message)
        await ws.send(json.dumps({"type": "stop"}))
        received = await asyncio.wait_for(reader, 120)
    return {"sent": len(messages), "received": received}


def rss_mb(pid: int) -> float:
    return round(proc_sample(pid)[1] / MB, 1)


def trend(values: list[float]) -> float:
    """MB per round over the second half (the first half is the warm-up)."""
    half = values[len(values) // 2 :]
    if len(half) < 3:
        return float("nan")
    return float(np.polyfit(np.arange(len(half)), np.array(half), 1)[0])


async def soak(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server = Server(tmp, env={"OMNILIVE_SCRIPTED__SLOTS": "2"}).start()
    try:
        await server.wait_ready(workers=1)
        [worker] = await worker_pids(server)
        gateway = server.process.pid  # type: ignore[union-attr]
        rounds: list[dict[str, Any]] = [
            {"round": 0, "worker_rss_mb": rss_mb(worker), "gateway_rss_mb": rss_mb(gateway)}
        ]
        first = rounds[0]
        print(f"start: worker {first['worker_rss_mb']} MB, gateway {first['gateway_rss_mb']} MB")
        messages = flood(args.messages)
        started = time.monotonic()
        for n in range(1, args.rounds + 1):
            half, duplex = await asyncio.gather(
                one_session(server, f"/ws/half_duplex/soak_h{n}", messages),
                one_session(server, f"/ws/duplex/soak_d{n}?mode=audio", messages),
            )
            await asyncio.sleep(args.settle_s)
            sample = {
                "round": n,
                "t_s": round(time.monotonic() - started, 1),
                "worker_rss_mb": rss_mb(worker),
                "gateway_rss_mb": rss_mb(gateway),
                "half_duplex": half,
                "duplex": duplex,
            }
            rounds.append(sample)
            print(
                f"round {n:3d}: worker {sample['worker_rss_mb']:7.1f} MB, "
                f"gateway {sample['gateway_rss_mb']:7.1f} MB"
            )
    finally:
        server.stop()
    worker_series = [r["worker_rss_mb"] for r in rounds]
    gateway_series = [r["gateway_rss_mb"] for r in rounds]
    return {
        "benchmark": "worker_soak",
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "rounds": args.rounds,
        "messages_per_session": args.messages,
        "messages_total": args.rounds * 2 * args.messages,
        "worker_rss_mb": {"start": worker_series[0], "after_round_1": worker_series[1],
                          "peak": max(worker_series), "end": worker_series[-1],
                          "trend_mb_per_round_second_half": round(trend(worker_series), 3)},
        "gateway_rss_mb": {"start": gateway_series[0], "peak": max(gateway_series),
                           "end": gateway_series[-1],
                           "trend_mb_per_round_second_half": round(trend(gateway_series), 3)},
        "samples": rounds,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--messages", type=int, default=10_000, help="per session and round")
    parser.add_argument("--settle-s", type=float, default=1.0)
    parser.add_argument("--name", default="worker_soak")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(soak(args, Path(tmp)))
    worker = result["worker_rss_mb"]
    print(
        f"worker: {worker['start']} -> {worker['after_round_1']} MB after the first round, "
        f"peak {worker['peak']}, end {worker['end']}; "
        f"trend {worker['trend_mb_per_round_second_half']} MB/round over the second half"
    )
    save_result(args.name, result)


if __name__ == "__main__":
    main()
