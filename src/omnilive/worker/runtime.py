"""A worker's engine, its slots and its state, shared by the session runners."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar

from omnilive.end_of_turn import TurnJudge
from omnilive.engines.base import (
    ChatSession,
    DuplexSession,
    Engine,
    EngineUnavailable,
    HalfDuplexSession,
)
from omnilive.engines.steps import Lane
from omnilive.engines.sync_views import on_lane
from omnilive.protocol.internal import (
    LoadOutcome,
    LoadProgress,
    LoadReport,
    SessionState,
    WorkerStatus,
)
from omnilive.worker.transcriber import SideTranscriber

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")


class WorkerNotReady(Exception):
    """A session arrived while the engine is loading or failed to load."""


class WorkerState(StrEnum):
    LOADING = "loading"
    IDLE = "idle"
    BUSY_CHAT = "busy_chat"
    BUSY_HALF_DUPLEX = "busy_half_duplex"
    DUPLEX_ACTIVE = "duplex_active"
    DUPLEX_PAUSED = "duplex_paused"
    ERROR = "error"


# ``conversation`` / ``openai_duplex``: a half-duplex / duplex session in the
# OpenAI Realtime dialect; ``live``: a duplex session in OpenAI's Live API.
SESSION_KINDS = (
    "chat",
    "half_duplex",
    "audio_duplex",
    "omni_duplex",
    "conversation",
    "openai_duplex",
    "live",
)
_BUSY_STATE = {
    "chat": WorkerState.BUSY_CHAT,
    "half_duplex": WorkerState.BUSY_HALF_DUPLEX,
    "conversation": WorkerState.BUSY_HALF_DUPLEX,
    "audio_duplex": WorkerState.DUPLEX_ACTIVE,
    "omni_duplex": WorkerState.DUPLEX_ACTIVE,
    "openai_duplex": WorkerState.DUPLEX_ACTIVE,
    "live": WorkerState.DUPLEX_ACTIVE,
}


@dataclass
class SessionRecord:
    session_id: str
    kind: str
    started_at: float
    state: WorkerState
    lane: Lane
    kv_cache_length: int = 0
    # The engine session's release, run as the lane's last step (set by the runner).
    closer: Callable[[], Any] | None = None


class WorkerRuntime:
    """Owns the engine. Model steps never run on the event loop: a session
    awaits its views' steps, and a synchronous engine's views run them on the
    session's own lane of the engine's step loop (:func:`on_lane`). A session
    that ends leaves its last step (the engine session's release) to the
    lane; its slot is free once that has run, so the engine is never used by
    two sessions of one slot, and the session never waits."""

    def __init__(self, engine: Engine, worker_id: str) -> None:
        self.engine = engine
        self.worker_id = worker_id
        # A Whisper beside an engine that does not transcribe (transcription.whisper).
        self.transcriber: SideTranscriber | None = None
        self.state = WorkerState.LOADING
        self.error: str | None = None
        self.sessions: dict[str, SessionRecord] = {}
        # Half-duplex turn-taking by meaning (set by the worker app; None: silence alone).
        self.turn_judge: TurnJudge | None = None
        self.total_requests = 0
        self.total_inference_s = 0.0
        self.load_progress: tuple[str, float] = ("starting", 0.0)
        self.steps = engine.step_loop()
        self._slot_count = engine.capabilities.slots
        self._slots = asyncio.Semaphore(self._slot_count)
        self._changed = asyncio.Event()

    # --- lifecycle -------------------------------------------------------------

    async def load(self) -> LoadReport:
        """Load the engine; the report says whether it can serve, and if not,
        whether loading it again could help."""

        def progress(stage: str, fraction: float) -> None:
            self.load_progress = (stage, fraction)
            log.info("loading %s: %3.0f%%", stage, 100 * fraction)

        started = time.perf_counter()
        try:
            await self.steps.call(self.engine.load, progress)
        except EngineUnavailable as exc:
            # Expected (a missing checkpoint, package or CPU feature): whoever
            # started the worker says so in one line, without a traceback.
            return self._failed(LoadReport(LoadOutcome.UNAVAILABLE, str(exc)))
        except Exception as exc:
            # A bug (the engine's or ours): logged once with its traceback and
            # reported, so that the worker exits instead of serving half-loaded.
            log.exception("engine %s failed to load", self.engine.name)
            return self._failed(LoadReport(LoadOutcome.FAILED, f"{type(exc).__name__}: {exc}"))
        log.info("engine %s ready in %.2f s", self.engine.name, time.perf_counter() - started)
        self._fit_slots()
        self._set_state(WorkerState.IDLE)
        return LoadReport(LoadOutcome.READY)

    def _fit_slots(self) -> None:
        """An engine may learn its slots only when loaded (as many as fit in
        GPU memory): its loop and the slot count follow, before any session."""
        slots = self.engine.capabilities.slots
        if slots != self._slot_count:
            loading, self.steps = self.steps, self.engine.step_loop()
            loading.close()
            self._slots = asyncio.Semaphore(slots)
            self._slot_count = slots

    def _failed(self, report: LoadReport) -> LoadReport:
        self.error = report.reason
        self._set_state(WorkerState.ERROR)
        return report

    def close(self) -> None:
        self.steps.close()
        self.engine.close()

    # --- sessions --------------------------------------------------------------

    @asynccontextmanager
    async def session(self, session_id: str, kind: str) -> AsyncIterator[SessionRecord]:
        """Hold one slot for a session. The gateway leases slots, so waiting
        here only covers a previous session that is still finishing its step."""
        if self.state in (WorkerState.LOADING, WorkerState.ERROR):
            raise WorkerNotReady(f"worker is {self.state.value}")
        await self._slots.acquire()
        lane = self.steps.lane(session_id, on_finished=self._slots.release)
        record = SessionRecord(session_id, kind, time.time(), _BUSY_STATE[kind], lane)
        self.sessions[session_id] = record
        self._refresh()
        try:
            yield record
        finally:
            lane.finish(record.closer)
            self.sessions.pop(session_id, None)
            self.total_requests += 1
            self._refresh()

    def set_session_state(self, record: SessionRecord, state: WorkerState) -> None:
        record.state = state
        self._refresh()

    # An engine's views, as the runners call them: a synchronous view's
    # steps on the session's lane, an async view's awaited as they are.
    def open_chat(self, record: SessionRecord) -> ChatSession:
        return on_lane(self.engine.open_chat(), record.lane)

    def open_half_duplex(self, record: SessionRecord) -> HalfDuplexSession:
        return on_lane(self.engine.open_half_duplex(), record.lane)

    def open_duplex(self, record: SessionRecord) -> DuplexSession:
        return on_lane(self.engine.open_duplex(), record.lane)

    async def step(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one model step: a view's coroutine (a plain function goes as
        ``record.lane.run``), its time counted as the worker's inference."""
        started = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            self.total_inference_s += time.perf_counter() - started

    async def stream(
        self, fn: Callable[P, AsyncGenerator[T, None]], *args: P.args, **kwargs: P.kwargs
    ) -> AsyncGenerator[T, None]:
        """Iterate a streamed step (an answer's chunks); leaving early closes it."""
        started = time.perf_counter()
        try:
            async with aclosing(fn(*args, **kwargs)) as items:
                async for item in items:
                    yield item
        finally:
            self.total_inference_s += time.perf_counter() - started

    # --- state -----------------------------------------------------------------

    def _set_state(self, state: WorkerState) -> None:
        self.state = state
        self._notify()

    def _refresh(self) -> None:
        if self.state in (WorkerState.LOADING, WorkerState.ERROR):
            return
        latest = max(self.sessions.values(), key=lambda r: r.started_at, default=None)
        self._set_state(latest.state if latest else WorkerState.IDLE)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def next_change(self) -> asyncio.Event:
        """The event the next change of state sets: take it before reading
        the state, and a change made meanwhile is not missed."""
        return self._changed

    def status(self) -> WorkerStatus:
        calls = max(1, self.total_requests)
        return WorkerStatus(
            worker_id=self.worker_id,
            worker_status=self.state.value,
            engine=self.engine.name,
            model_loaded=self.state not in (WorkerState.LOADING, WorkerState.ERROR),
            load_progress=LoadProgress(stage=self.load_progress[0], fraction=self.load_progress[1]),
            error=self.error,
            gpu_id=self.engine.gpu_id(),
            pid=os.getpid(),
            slots=self.engine.capabilities.slots,
            capabilities=self.engine.capabilities.to_dict(),
            current_session_id=next(iter(self.sessions), None),
            sessions=[
                SessionState(session_id=r.session_id, kind=r.kind, state=r.state.value)
                for r in self.sessions.values()
            ],
            total_requests=self.total_requests,
            avg_inference_time_ms=round(1000 * self.total_inference_s / calls, 1),
            kv_cache_length=max((r.kv_cache_length for r in self.sessions.values()), default=0),
        )
