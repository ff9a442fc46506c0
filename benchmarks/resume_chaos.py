"""Chaos run for resumable sessions (issue 37, docs/resume.md).

``--sessions`` duplex sessions (scripted engine) start over ``--minutes``,
each through its own TCP proxy, each sending a second of audio a second for
``--session-s`` seconds (a unit takes 0.4 s of scripted model steps). At
random moments, often while a unit's result is on its way, the proxy cuts
the connection
(``--cut-fraction`` of the sessions, 1-2 cuts each); the client stays away
for a random 0.5-10 s, then resumes with its token and the last event number
it received. A few sessions (``--abandon-fraction``) never come back: the
gateway must end them when the grace period is over.

Counted: sessions that resumed (and how often), events lost or duplicated
(every session's ``seq`` must run 1, 2, 3, ... with no gap and no repeat;
goal 0), resumes refused, and slots leaked (busy slots, suspended sessions
and running tasks once every session is over; goal 0). Results go to
benchmarks/results/resume_chaos.json.

    python -m benchmarks.resume_chaos --sessions 100 --minutes 5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import platform
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from tests.tcp_proxy import TcpProxy
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from benchmarks.load import save_result

SECOND = base64.b64encode((np.zeros(16000, "<f4") + 0.01).tobytes()).decode()


@dataclass
class Outcome:
    cuts: int = 0
    resumes: int = 0
    refused: int = 0
    abandoned: bool = False
    events: int = 0
    lost: int = 0  # gaps in seq
    duplicated: int = 0  # a seq seen twice
    replayed: int = 0
    server_lost: int = 0  # the server's own events_lost
    stopped: bool = False
    error: str | None = None
    gaps_ms: list[float] = field(default_factory=list)


class Client:
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.ws: ClientConnection | None = None
        self.token: str | None = None
        self.last_seq = 0

    async def reader(self, ws: ClientConnection, done: asyncio.Event) -> None:
        try:
            async for raw in ws:
                event = json.loads(raw)
                if event["type"] == "session.resumed":
                    self.token = event["resume_token"]
                    self.outcome.replayed += event["replayed"]
                    self.outcome.server_lost += event["events_lost"]
                    continue
                seq = event.get("seq")
                if seq is not None:
                    if seq <= self.last_seq:
                        self.outcome.duplicated += 1
                    elif seq > self.last_seq + 1:
                        self.outcome.lost += seq - self.last_seq - 1
                    self.last_seq = max(self.last_seq, seq)
                self.outcome.events += 1
                if self.token is None and "resume_token" in event:
                    self.token = event["resume_token"]
                if event["type"] == "stopped":
                    self.outcome.stopped = True
                    done.set()
        except ConnectionClosed:
            pass


async def one_session(
    server: Server, index: int, args: argparse.Namespace, rng: random.Random
) -> Outcome:
    outcome = Outcome()
    proxy = await TcpProxy(server.port).start()
    client = Client(outcome)
    done = asyncio.Event()
    cuts = rng.choice([1, 2]) if rng.random() < args.cut_fraction else 0
    cut_at = sorted(rng.uniform(2, args.session_s - 2) for _ in range(cuts))
    abandon = cuts > 0 and rng.random() < args.abandon_fraction
    outcome.abandoned = abandon
    readers: list[asyncio.Task[None]] = []
    phase = "connect"
    try:
        ws = await connect(f"{proxy.ws}/ws/duplex/chaos_{index}?mode=audio_duplex&seq=1")
        readers.append(asyncio.create_task(client.reader(ws, done), name=f"chaos{index}:read"))
        prepare = {"type": "prepare", "system_prompt": "#schedule:LSSSE #latency:0.2", "config": {}}
        await ws.send(json.dumps(prepare))
        start = time.monotonic()
        for second in range(int(args.session_s)):
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps({"type": "audio_chunk", "audio_base64": SECOND}))
            if cut_at and time.monotonic() - start >= cut_at[0]:
                cut_at.pop(0)
                # mid-unit: its result (0.4 s of model steps) is often in flight
                await asyncio.sleep(rng.uniform(0.0, 0.6))
                proxy.cut()
                outcome.cuts += 1
                away = rng.uniform(0.5, 10.0)
                outcome.gaps_ms.append(away * 1000)
                await asyncio.sleep(away)
                if abandon:
                    return outcome
                last = client.last_seq
                url = f"{proxy.ws}/ws/duplex/x?resume_token={client.token}&last_seq={last}"
                phase = f"resume {outcome.cuts}"
                ws = await connect(url)
                readers.append(
                    asyncio.create_task(client.reader(ws, done), name=f"chaos{index}:read")
                )
                outcome.resumes += 1
            await asyncio.sleep(max(0.0, start + second + 1 - time.monotonic()))
        phase = "stop"
        await ws.send(json.dumps({"type": "stop"}))
        async with asyncio.timeout(30):
            await done.wait()
        await ws.close()
    except ConnectionClosed as exc:
        if exc.rcvd is not None and exc.rcvd.code == 1008:  # the resume was refused
            outcome.refused += 1
            late = bool(outcome.gaps_ms) and outcome.gaps_ms[-1] > args.grace_s * 1000
            outcome.error = None if late else f"{phase}: refused within the grace period: {exc}"
        else:
            outcome.error = f"{phase}: {type(exc).__name__}: {exc}"
    except Exception as exc:  # counted, not raised: the run goes on
        outcome.error = f"{phase}: {type(exc).__name__}: {exc}"
    finally:
        await proxy.close()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return outcome


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    env = {
        "OMNILIVE_SCRIPTED__SLOTS": str(args.slots),
        "OMNILIVE_LIMITS__RESUME_GRACE_S": str(args.grace_s),
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), env=env).start()
        try:
            await server.wait_ready(workers=1)
            began = time.monotonic()
            interval = args.minutes * 60 / args.sessions
            tasks = []
            for index in range(args.sessions):
                seed = random.Random(rng.random())
                name = f"chaos{index}"
                tasks.append(asyncio.create_task(one_session(server, index, args, seed), name=name))
                await asyncio.sleep(interval)
            outcomes: list[Outcome] = await asyncio.gather(*tasks)
            # abandoned sessions end when their grace period is over
            await asyncio.sleep(args.grace_s + 2)
            status = await server.get("/status")
            wall_s = time.monotonic() - began
        finally:
            server.stop()
    finished = [o for o in outcomes if not o.abandoned and not o.refused]
    return {
        "benchmark": "resume_chaos",
        "host": platform.node(),
        "args": vars(args),
        "wall_s": round(wall_s, 1),
        "sessions": len(outcomes),
        "sessions_cut": sum(1 for o in outcomes if o.cuts),
        "cuts": sum(o.cuts for o in outcomes),
        "sessions_resumed": sum(1 for o in outcomes if o.resumes),
        "resumes": sum(o.resumes for o in outcomes),
        "resumes_refused": sum(o.refused for o in outcomes),
        "sessions_abandoned": sum(1 for o in outcomes if o.abandoned),
        "sessions_stopped_cleanly": sum(1 for o in finished if o.stopped),
        "events": sum(o.events for o in outcomes),
        "events_replayed": sum(o.replayed for o in outcomes),
        "events_lost": sum(o.lost for o in finished),
        "events_duplicated": sum(o.duplicated for o in outcomes),
        "events_lost_said_by_server": sum(o.server_lost for o in outcomes),
        "errors": [o.error for o in outcomes if o.error],
        "after": {
            "slots_busy": status["workers"]["slots_busy"],
            "suspended_sessions": status["suspended_sessions"],
            "running_tasks": len(status["running_tasks"]),
        },
        "slots_leaked": status["workers"]["slots_busy"] + len(status["running_tasks"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--session-s", type=float, default=30.0)
    parser.add_argument("--cut-fraction", type=float, default=0.8)
    parser.add_argument("--abandon-fraction", type=float, default=0.1)
    parser.add_argument("--grace-s", type=float, default=30.0)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--name", default="resume_chaos")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=2))
    save_result(args.name, result)


if __name__ == "__main__":
    main()
