"""omnilive on a local Ray cluster: worker actors on (declared) GPUs, two
gateways sharing one FIFO queue, a worker actor killed mid-session, a GPU
node joining while clients wait. The tests share one cluster and run in
this order (the last one grows it by a node)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from tests.clients import Client, open_client
from tests.cluster.conftest import GPUS
from tests.cluster.local import Cluster
from tests.recordings import meta_when
from tests.servers import Server, chat_once, recv, until, user

SECOND = np.full(16000, 0.01, np.float32)


async def queued_chat(gateway: Server, text: str) -> tuple[ClientConnection, dict[str, Any]]:
    """A chat request that has to wait: its socket and its ``queued`` message."""
    ws = await connect(f"{gateway.ws}/ws/chat", max_size=None)
    await ws.send(json.dumps(user(text)))
    queued = await recv(ws)
    assert queued["type"] == "queued", queued
    return ws, queued


async def hold_worker(gateway: Server) -> Client:
    """A duplex session that keeps one worker's slot until it stops."""
    client = await open_client(gateway, path="/ws/duplex", query="?mode=audio")
    await client.prepare("#schedule:L")
    return client


async def workers(gateway: Server) -> list[dict[str, Any]]:
    return (await gateway.get("/workers"))["workers"]


async def worker_of(gateway: Server, session_id: str) -> dict[str, Any]:
    """The worker serving ``session_id``, once the gateway's view shows it."""
    async with asyncio.timeout(5):
        while True:
            for worker in await workers(gateway):
                if any(s["session_id"] == session_id for s in worker["sessions"]):
                    return worker
            await asyncio.sleep(0.05)


async def test_chat_and_duplex_through_both_gateways(cluster: Cluster):
    for index, gateway in enumerate(cluster.gateways):
        answer = (await chat_once(gateway, user(f"hello from gateway {index}")))[-1]
        assert answer["type"] == "done" and f"hello from gateway {index}" in answer["text"]
        client = await open_client(gateway, path="/ws/duplex", query="?mode=audio")
        await client.prepare("#schedule:LS")
        results = []
        for _ in range(4):
            await client.chunk(SECOND)
            results.append(await client.until("result"))
        assert [r["is_listen"] for r in results] == [True, False, True, False]
        await client.send({"type": "stop"})
        await client.until("stopped")
    # Both gateways show the same workers: the cluster's, on loopback here.
    seen = [sorted((w["worker_id"], w["url"]) for w in await workers(g)) for g in cluster.gateways]
    assert seen[0] == seen[1] and len(seen[0]) == GPUS
    assert all(url.startswith("http://127.0.0.1:") for _, url in seen[0])


async def test_one_fifo_queue_across_gateways(cluster: Cluster):
    first, second = cluster.gateways
    holders = [await hold_worker(first), await hold_worker(second)]
    waiting: list[ClientConnection] = []
    for index in range(6):  # alternating gateways, each queued behind the last
        ws, queued = await queued_chat(cluster.gateways[index % 2], f"waiting {index}")
        assert (queued["position"], queued["queue_length"]) == (index + 1, index + 1)
        waiting.append(ws)
    # The queue as each gateway shows it: one queue, with waits growing in order.
    for gateway in cluster.gateways:
        async with asyncio.timeout(5):
            while True:
                items = (await gateway.get("/api/queue"))["items"]
                if len(items) == 6:
                    break
                await asyncio.sleep(0.05)
        assert [item["position"] for item in items] == [1, 2, 3, 4, 5, 6]
        waits = [item["estimated_wait_s"] for item in items]
        assert waits == sorted(waits) and waits[-1] > waits[0]
    # One leaves (through the first gateway): those behind it move up, on both.
    await waiting.pop(2).close()
    for place, ws in enumerate(waiting[2:], start=3):
        async with asyncio.timeout(5):
            while (await until(ws, "queue_update"))["position"] != place:
                pass
    # One slot frees up: the queue is served in its order, whichever gateway.
    served: list[int] = []

    async def served_in_turn(number: int, ws: ClientConnection) -> None:
        assert (await until(ws, "done", "error", timeout=30))["type"] == "done"
        served.append(number)

    await holders[0].send({"type": "stop"})
    numbers = [0, 1, 3, 4, 5]
    await asyncio.gather(*(served_in_turn(n, ws) for n, ws in zip(numbers, waiting, strict=True)))
    assert served == numbers
    await holders[1].send({"type": "stop"})
    for ws in waiting:
        await ws.close()


async def test_killed_worker_actor_fails_its_session_fast_and_rejoins(cluster: Cluster):
    first, second = cluster.gateways
    victim = await open_client(second, path="/ws/duplex", query="?mode=audio")
    prepared = await victim.prepare("#schedule:LS #latency:0.3")
    for _ in range(2):
        await victim.chunk(SECOND)
        await victim.until("result")
    other = await hold_worker(first)
    waiting, _ = await queued_chat(first, "queued during the crash")
    dead = await worker_of(second, victim.session_id)
    await victim.chunk(SECOND)  # in flight at the kill
    os.kill(dead["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    failure = await victim.until("error")
    assert failure["code"] == "worker_failed" and time.monotonic() - killed_at < 2.0
    # The queued client is not handed the dead worker's slot: it is served
    # once Ray has restarted the actor, which registered at a new address.
    assert (await until(waiting, "done", "error", timeout=60))["type"] == "done"
    await waiting.close()
    async with asyncio.timeout(30):
        while True:
            back = next(w for w in await workers(first) if w["worker_id"] == dead["worker_id"])
            if back["status"] == "idle" and back["pid"] != dead["pid"]:
                break
            await asyncio.sleep(0.1)
    assert back["url"] != dead["url"]
    meta = await meta_when(second, prepared["recording_session_id"], "abnormal")
    assert meta["ended_at"]
    await other.send({"type": "stop"})
    for gateway in cluster.gateways:
        assert (await chat_once(gateway, user("after the crash")))[-1]["type"] == "done"


async def test_a_gpu_node_that_joins_serves_the_waiting_clients(cluster: Cluster):
    first, second = cluster.gateways
    holders = [await hold_worker(first), await hold_worker(second)]
    waiting = [(await queued_chat(gateway, "for the new node"))[0] for gateway in (first, second)]
    cluster.add_gpu_node()
    for ws in waiting:
        assert (await until(ws, "done", "error", timeout=90))["type"] == "done"
        await ws.close()
    async with asyncio.timeout(5):  # the gateway's view follows the registry's
        while True:
            listed = {w["worker_id"]: w for w in await workers(second)}
            if listed.get(f"w{GPUS}", {}).get("total_requests") == 2:
                break
            await asyncio.sleep(0.05)
    assert len(listed) == GPUS + 1
    for holder in holders:
        await holder.send({"type": "stop"})
        await holder.until("stopped")
    status = await first.wait_ready(workers=GPUS + 1)
    assert status["workers"]["slots_total"] == GPUS + 1
