"""The metrics observer fed typed facts, without sockets: the envelope's
fields as each dialect writes them, the observer's metrics, and how the
middleware, ``send_json`` and ``relay_to_client`` reach it."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket

from omnilive.engines.messages import DuplexUnit
from omnilive.gateway.bridge import SessionEnd, relay_to_client
from omnilive.gateway.client_ws import send_json
from omnilive.gateway.metrics import GatewayMetrics
from omnilive.gateway.observe import (
    OBSERVER_KEY,
    ObserveMiddleware,
    SessionObserver,
    session_observer,
)
from omnilive.protocol.common import error_message, queued_message
from omnilive.protocol.internal import CLOSE_OK, Envelope
from omnilive.protocol.realtime import RealtimeErrorCode, delta_event, error_event
from omnilive.protocol.realtime_v2 import event
from omnilive.worker.chunk_buffer import PendingChunk
from omnilive.worker.presenter_v2 import RealtimeV2Presenter
from omnilive.worker.presenters import DuplexPresenter, UnitTiming

SPEECH = np.zeros(2400, np.float32)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def observer(mode: str, wall: float = 1_700_000_000.0) -> tuple[SessionObserver, Clock]:
    clock = Clock()
    return SessionObserver(mode, GatewayMetrics(), clock, lambda: wall), clock


def unit_messages(presenter: Any, unit: DuplexUnit, index: int = 4, dropped: int = 0) -> list:
    """What a worker's presenter makes of one unit received 0.25 s ago."""
    chunk = PendingChunk(index, time.monotonic() - 0.25, time.time(), np.zeros(16000, np.float32),
                         dropped_before=dropped)  # fmt: skip
    return presenter.unit(unit, chunk, UnitTiming(10, 20, 0, 0, 0, 7))


def through_the_wire(message: dict[str, Any]) -> Envelope:
    envelope, payload = Envelope.split(Envelope.frame(message))
    assert json.loads(payload) == message
    return envelope


# --- the envelope --------------------------------------------------------------------


def test_a_duplex_result_carries_its_unit_facts():
    [result] = unit_messages(DuplexPresenter(), DuplexUnit(False, "hi", SPEECH, True), 4, 2)
    envelope = through_the_wire(result)
    assert envelope.type == "result"
    assert envelope.sent_at_ms == result["server_send_ts"]  # the result stamps milliseconds
    assert envelope.wall_clock_ms == result["wall_clock_ms"] >= 250
    assert (envelope.dropped_chunks, envelope.unit_index, envelope.end_of_turn) == (2, 4, True)


def test_a_duplex_result_carries_its_context():
    unit = DuplexUnit(True, kv_cache_length=900, context_capacity=8192, evicted_units=12)
    [result] = unit_messages(DuplexPresenter(), unit)
    envelope = through_the_wire(result)
    assert (envelope.kv_cache_length, envelope.context_capacity, envelope.evicted_units) == (
        900, 8192, 12)  # fmt: skip
    # An engine that tells no capacity: the header leaves it out, the rest stays.
    [unsized] = unit_messages(DuplexPresenter(), DuplexUnit(True, kv_cache_length=40))
    unsized_envelope = through_the_wire(unsized)
    assert (unsized_envelope.context_capacity, unsized_envelope.evicted_units) == (None, 0)


def test_the_newer_realtime_dialect_carries_the_context_under_metrics():
    unit = DuplexUnit(False, "hi", SPEECH, kv_cache_length=700, context_capacity=4096,
                      evicted_units=3)  # fmt: skip
    for delta in unit_messages(RealtimeV2Presenter("s"), unit):
        assert delta["metrics"]["context_capacity"] == 4096
        envelope = through_the_wire(delta)
        assert (envelope.kv_cache_length, envelope.context_capacity, envelope.evicted_units) == (
            700, 4096, 3)  # fmt: skip
    older = through_the_wire(delta_event("hi", "AAAA", True, 5))  # the older dialect: none
    assert (older.kv_cache_length, older.context_capacity, older.evicted_units) == (None,) * 3


def test_the_header_is_compact_and_leaves_out_what_a_message_lacks():
    header = Envelope.frame({"type": "prepared", "recording_session_id": "hd_1"}).split("\n")[0]
    assert header == '{"type":"prepared","recording_id":"hd_1"}'
    listen = Envelope.frame({"type": "result", "is_listen": True, "end_of_turn": False})
    assert listen.split("\n")[0] == '{"type":"result","end_of_turn":false}'


def test_the_newer_realtime_dialect_keeps_them_under_metrics_in_seconds():
    presenter = RealtimeV2Presenter("s")
    text, audio, listen = unit_messages(presenter, DuplexUnit(False, "hi", SPEECH, True), 0, 3)
    for delta in (text, audio, listen):
        envelope = through_the_wire(delta)
        assert envelope.sent_at_ms == pytest.approx(delta["server_send_ts"] * 1000, abs=0.1)
        assert envelope.wall_clock_ms == delta["metrics"]["wall_clock_ms"] >= 250
        assert (envelope.dropped_chunks, envelope.unit_index) == (3, delta["chunk_index"])
    assert [through_the_wire(d).end_of_turn for d in (text, audio, listen)] == [None, None, True]
    [idle] = unit_messages(presenter, DuplexUnit(True), 1)
    assert through_the_wire(idle).end_of_turn is False  # a listen that ends no response


def test_the_older_realtime_dialect_tells_only_the_end_of_turn():
    envelope = through_the_wire(delta_event("hi", "AAAA", True, 5))
    assert envelope.end_of_turn is True
    assert (envelope.sent_at_ms, envelope.wall_clock_ms, envelope.dropped_chunks) == (None,) * 3


def test_errors_carry_their_code_in_either_shape():
    flat = through_the_wire(error_message("boom", "inference_error"))
    nested = through_the_wire(error_event(RealtimeErrorCode.NOT_READY, "wait"))
    assert (flat.code, flat.error) == ("inference_error", "boom")
    assert (nested.code, nested.error) == ("not_ready", "wait")
    assert through_the_wire({"type": "error", "error": "no code"}).code is None
    assert through_the_wire({"type": "done", "code": "x"}).code is None  # only errors have one


# --- the observer -------------------------------------------------------------------


def test_queue_wait_runs_from_queued_to_queue_done():
    watch, clock = observer("duplex")
    watch.sent(queued_message(1, 3.0, "t1", 1))
    clock.now += 1
    watch.sent({"type": "queue_update", "position": 1})
    clock.now += 1.5
    watch.sent({"type": "queue_done"})
    clock.now += 9
    watch.relayed(Envelope("prepared"))
    wait = watch.metrics.queue_wait
    assert sum(wait.counts[("duplex",)]) == 1
    assert wait.sums[("duplex",)] == pytest.approx(2.5)


def test_a_request_never_queued_waited_nothing_and_errors_do_not_serve_it():
    watch, _ = observer("realtime")
    watch.sent(error_event(RealtimeErrorCode.UNKNOWN_EVENT, "what?"))
    assert ("realtime",) not in watch.metrics.queue_wait.counts
    watch.relayed(Envelope("session.created"))
    assert watch.metrics.queue_wait.sums[("realtime",)] == 0.0
    assert sum(watch.metrics.queue_wait.counts[("realtime",)]) == 1


def test_errors_are_counted_by_code_whoever_sent_them():
    watch, _ = observer("chat")
    watch.sent(error_message("bad", "invalid_json"))
    watch.sent(error_event(RealtimeErrorCode.QUEUE_FULL, "full"))
    watch.relayed(Envelope.of(error_message("boom", "inference_error")))
    watch.relayed(Envelope("error"))
    assert watch.metrics.errors.values == {
        ("chat", "invalid_json"): 1,
        ("chat", "queue_full"): 1,
        ("chat", "inference_error"): 1,
        ("chat", "unknown"): 1,
    }


def test_a_chat_turn_runs_from_the_request():
    watch, clock = observer("chat")
    watch.received()
    clock.now += 0.5
    watch.received()  # later frames do not move the start
    watch.relayed(Envelope("chunk"))
    clock.now += 1
    watch.relayed(Envelope("chunk"))
    clock.now += 2
    watch.relayed(Envelope("done"))
    turns = watch.metrics.turn_latency
    assert turns.sums == {("chat", "first_chunk"): 0.5, ("chat", "done"): 3.5}
    assert sum(turns.counts[("chat", "first_chunk")]) == 1


def test_a_half_duplex_turn_runs_from_generating():
    watch, clock = observer("half_duplex")
    watch.received()  # not a chat: a frame starts nothing
    watch.relayed(Envelope("chunk"))
    watch.relayed(Envelope("generating"))
    clock.now += 0.25
    watch.relayed(Envelope("chunk"))
    clock.now += 1
    watch.relayed(Envelope("turn_done"))
    watch.relayed(Envelope("turn_done"))  # no turn in progress: not timed
    turns = watch.metrics.turn_latency
    assert turns.sums == {("half_duplex", "first_chunk"): 0.25, ("half_duplex", "done"): 1.25}


def test_a_duplex_result_feeds_the_relay_and_unit_latencies_and_drops():
    [result] = unit_messages(DuplexPresenter(), DuplexUnit(False, "hi", SPEECH), 4, 2)
    watch, _ = observer("duplex", wall=result["server_send_ts"] / 1000 + 0.003)
    watch.relayed(through_the_wire(result))
    metrics = watch.metrics
    assert metrics.relay_latency.sums[("duplex",)] == pytest.approx(0.003, abs=1e-5)
    assert metrics.unit_latency.sums[("duplex",)] == pytest.approx(result["wall_clock_ms"] / 1000)
    assert metrics.dropped_chunks.values == {("duplex",): 2}


def test_a_clock_behind_the_workers_is_no_negative_delay():
    watch, _ = observer("duplex", wall=1.0)
    watch.relayed(Envelope("result", sent_at_ms=5000.0))
    assert watch.metrics.relay_latency.sums[("duplex",)] == 0.0


def test_a_unit_spread_over_deltas_counts_once():
    presenter = RealtimeV2Presenter("s")
    watch, _ = observer("realtime")
    for index in (0, 1):
        for delta in unit_messages(presenter, DuplexUnit(False, "hi", SPEECH, True), index, 2):
            watch.relayed(through_the_wire(delta))
    metrics = watch.metrics
    assert sum(metrics.relay_latency.counts[("realtime",)]) == 6  # every event is stamped
    assert sum(metrics.unit_latency.counts[("realtime",)]) == 2
    assert metrics.dropped_chunks.values == {("realtime",): 4}


def test_the_gateways_own_stamps_are_not_a_relay():
    watch, _ = observer("realtime")
    watch.sent(event("response.output.delta", kind="text", metrics={"wall_clock_ms": 5.0}))
    assert not watch.metrics.relay_latency.counts and not watch.metrics.unit_latency.counts


# --- how session code reaches it ------------------------------------------------------------


def scope(path: str, state: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "websocket", "path": path, "headers": [], "state": state or {}}


async def nothing() -> dict[str, Any]:
    raise AssertionError("not read")


async def ignore(_: Any) -> None:
    return None


def test_session_observer_is_the_connections_own():
    watch, _ = observer("duplex")
    assert session_observer(WebSocket(scope("/ws/duplex/a", {OBSERVER_KEY: watch}), nothing,
                                      ignore)) is watch  # fmt: skip
    assert session_observer(WebSocket(scope("/ws/duplex/a"), nothing, ignore)) is None


class Worker:
    """The worker side of a session socket: enveloped frames, then a close."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.frames = [Envelope.frame(m) for m in messages]
        self.close_code = CLOSE_OK

    async def __aiter__(self) -> Any:
        for frame in self.frames:
            yield frame


async def test_relay_to_client_tells_the_clients_observer():
    watch, _ = observer("chat")
    client = WebSocket(scope("/ws/chat", {OBSERVER_KEY: watch}), nothing, ignore)
    sent: list[str] = []

    async def to_client(payload: str) -> None:
        sent.append(payload)

    worker = Worker(error_message("boom", "inference_error"), {"type": "done"})
    assert await relay_to_client(worker, to_client, client=client) is SessionEnd.OK  # type: ignore[arg-type]
    assert [json.loads(p)["type"] for p in sent] == ["error", "done"]
    assert watch.metrics.errors.values == {("chat", "inference_error"): 1}
    assert await relay_to_client(Worker({"type": "error"}), to_client) is SessionEnd.OK  # type: ignore[arg-type]
    assert len(watch.metrics.errors.values) == 1  # no client: nobody told


def test_the_middleware_counts_frames_and_hands_send_json_the_observer():
    metrics = GatewayMetrics()
    seen: list[SessionObserver | None] = []

    async def session(ws: WebSocket) -> None:
        seen.append(session_observer(ws))
        await ws.accept()
        await ws.receive_text()
        await send_json(ws, error_message("nope", "invalid_json"))
        await ws.close()

    routes = [WebSocketRoute("/ws/chat", session), WebSocketRoute("/other", session)]
    app = ObserveMiddleware(Starlette(routes=routes), metrics)
    with TestClient(app) as http, http.websocket_connect("/ws/chat") as ws:
        ws.send_text("{nope")
        assert json.loads(ws.receive_text())["code"] == "invalid_json"
    with TestClient(app) as http, http.websocket_connect("/other") as ws:
        ws.send_text("{nope")
        ws.receive_text()
    assert isinstance(seen[0], SessionObserver) and seen[0].mode == "chat"
    assert seen[1] is None
    assert metrics.sessions_opened.values == {("chat",): 1}
    assert metrics.messages.values == {("chat", "in"): 1, ("chat", "out"): 1}
    assert metrics.errors.values == {("chat", "invalid_json"): 1}


def test_the_middleware_forgets_the_sessions_context_when_its_connection_ends():
    metrics = GatewayMetrics()
    shown: list[list[dict[str, Any]]] = []

    async def session(ws: WebSocket) -> None:
        watch = session_observer(ws)
        assert watch is not None
        watch.worker_id, watch.session_id = "w0", "dx_1"
        watch.relayed(Envelope("result", unit_index=0, kv_cache_length=300, context_capacity=600))
        shown.append(metrics.live.contexts())
        await ws.accept()
        raise RuntimeError("the handler fails")  # the context goes all the same

    app = ObserveMiddleware(Starlette(routes=[WebSocketRoute("/ws/duplex/dx_1", session)]), metrics)
    with TestClient(app) as http, pytest.raises(RuntimeError):  # noqa: SIM117
        with http.websocket_connect("/ws/duplex/dx_1"):
            pass
    assert [c["session_id"] for c in shown[0]] == ["dx_1"] and shown[0][0]["fill"] == 0.5
    assert metrics.live.contexts() == []
