"""``GET /metrics``: the Prometheus text format, fed by real sessions."""

from __future__ import annotations

import json
import math
import re

import httpx
import numpy as np
from websockets.asyncio.client import connect

from omnilive.gateway.metrics import GatewayMetrics, HistogramFamily
from tests.clients import open_client
from tests.servers import Server, chat_once, user

SAMPLE = re.compile(
    r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*=\"(?:[^\"\\\n]|\\.)*\""
    r"(,[a-zA-Z_][a-zA-Z0-9_]*=\"(?:[^\"\\\n]|\\.)*\")*\})? (-?[0-9.e+-]+|[+-]Inf|NaN)$"
)


def samples(text: str) -> dict[str, float]:
    """Every sample line, checked against the exposition format."""
    found = {}
    for line in text.splitlines():
        if line.startswith("# "):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$", line), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        found[name] = float(value)
    return found


def test_histograms_and_label_escaping():
    metrics = GatewayMetrics()
    for value in (0.0002, 0.003, 0.003, 2.0):
        metrics.relay_latency.observe(value, "duplex")
    metrics.errors.inc('we"ird\nmode', "x\\y")
    found = samples(metrics.render(None))
    assert found['omnilive_relay_latency_seconds_bucket{mode="duplex",le="0.0005"}'] == 1
    assert found['omnilive_relay_latency_seconds_bucket{mode="duplex",le="0.005"}'] == 3
    assert found['omnilive_relay_latency_seconds_bucket{mode="duplex",le="+Inf"}'] == 4
    assert found['omnilive_relay_latency_seconds_count{mode="duplex"}'] == 4
    assert math.isclose(found['omnilive_relay_latency_seconds_sum{mode="duplex"}'], 2.0062)
    assert found['omnilive_errors_total{mode="we\\"ird\\nmode",code="x\\\\y"}'] == 1
    histogram = HistogramFamily("h", "help", (1.0, 2.0))
    for value in (0.5, 0.5, 1.5, 3.0):
        histogram.observe(value)
    assert histogram.quantile(0.5) == 1.0 and histogram.quantile(0.99) == math.inf


async def test_metrics_follow_real_sessions(server: Server):
    assert (await chat_once(server, user("count me")))[-1]["type"] == "done"
    async with connect(f"{server.ws}/ws/chat") as ws:
        await ws.send("{nope")
        assert json.loads(await ws.recv())["code"] == "invalid_json"
    client = await open_client(server, path="/ws/duplex", query="?mode=audio")
    await client.prepare("#schedule:LS")
    for _ in range(3):
        await client.chunk(np.zeros(16000, np.float32))
        await client.until("result")
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{server.http}/metrics", timeout=10)
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = samples(response.text)
    assert found['omnilive_workers{state="duplex_active"}'] == 1
    assert found['omnilive_sessions{mode="audio_duplex"}'] == 1
    assert found["omnilive_queue_length"] == 0
    assert found['omnilive_sessions_opened_total{mode="chat"}'] == 2
    assert found['omnilive_errors_total{mode="chat",code="invalid_json"}'] == 1
    assert found['omnilive_turn_latency_seconds_count{mode="chat",stage="done"}'] == 1
    assert found['omnilive_turn_latency_seconds_count{mode="chat",stage="first_chunk"}'] == 1
    assert found['omnilive_relay_latency_seconds_count{mode="duplex"}'] == 3
    assert found['omnilive_unit_latency_seconds_count{mode="duplex"}'] == 3
    assert found['omnilive_queue_wait_seconds_count{mode="duplex"}'] == 1
    assert found['omnilive_http_responses_total{status="200"}'] >= 1


async def test_dropped_chunks_are_counted(server: Server):
    client = await open_client(server, path="/ws/duplex", query="?mode=audio")
    await client.prepare("#schedule:L #latency:0.6")
    for _ in range(6):  # faster than the model: older chunks are dropped
        await client.chunk(np.zeros(16000, np.float32))
    dropped = 0
    while dropped == 0:  # the drops are reported on the next unit processed
        dropped = (await client.until("result"))["dropped_chunks"]
    found = samples((await _metrics(server)).text)
    assert found['omnilive_dropped_chunks_total{mode="duplex"}'] >= dropped > 0


async def _metrics(server: Server) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"{server.http}/metrics", timeout=10)


def test_metrics_route_is_admin_only():
    # (covered for every route by test_routes.py; named here for the reader)
    from omnilive.gateway.access import Access, AccessTable

    assert AccessTable([]).classify("GET", "/metrics").access is Access.ADMIN
