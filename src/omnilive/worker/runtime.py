"""A worker's engine, its slots and its state, shared by the session runners."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, cast, overload

from omnilive.end_of_turn import TurnJudge
from omnilive.engines.base import Engine, EngineUnavailable
from omnilive.engines.steps import Lane
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
    """Owns the engine. Model steps run on the engine's step loop, never on
    the event loop: each session submits its steps to its own lane and awaits
    them. A session that ends leaves its last step (the engine session's
    release) to the lane; its slot is free once that has run, so the engine is
    never used by two sessions of one slot, and the session never waits."""

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

    # An engine's view makes a step a plain function or a coroutine function
    # (engines/base.py): either way the caller gets the step's result.
    @overload
    async def step(
        self, record: SessionRecord, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> T: ...

    @overload
    async def step(self, record: SessionRecord, fn: Callable[..., T], *args: Any) -> T: ...

    async def step(self, record: SessionRecord, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one model step of ``record``'s session: awaited here when the
        engine's step is a coroutine function (the engine keeps its blocking
        work on threads of its own), else on the session's lane."""
        started = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(fn):  # the engine's own async step: no thread here
                return await fn(*args)
            return await record.lane.run(fn, *args)
        finally:
            self.total_inference_s += time.perf_counter() - started

    async def stream(
        self,
        record: SessionRecord,
        fn: Callable[..., Iterator[T]] | Callable[..., AsyncIterator[T]],
        *args: Any,
    ) -> AsyncGenerator[T, None]:
        """Iterate a streamed step of ``record``'s session (an answer's chunks)."""
        started = time.perf_counter()
        try:
            if inspect.isasyncgenfunction(fn):  # the engine's own async answer
                async with aclosing(fn(*args)) as items:
                    async for item in items:
                        yield item
            else:
                # Not an async generator function: a plain iterator's.
                plain = cast("Callable[..., Iterator[T]]", fn)
                async for item in record.lane.stream(plain, *args):
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
