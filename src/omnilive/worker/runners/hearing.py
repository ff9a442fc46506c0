"""Early work while the user speaks, for the runners with server VAD: the
speech so far goes to the engine's optional ``hear`` step (a transcript, an
answer started at a pause), with at most one such step in flight and the
newest request winning. Early work is optional: an engine error in it is
logged, and the turn's prefill does the work again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from omnilive.engines.base import EngineError, HalfDuplexSession
from omnilive.worker.runtime import SessionRecord, WorkerRuntime

log = logging.getLogger(__name__)
Spawn = Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]]


class EarlyHearing:
    def __init__(
        self,
        runtime: WorkerRuntime,
        record: SessionRecord,
        session: HalfDuplexSession,
        spawn: Spawn,
    ) -> None:
        self._runtime = runtime
        self._record = record
        self._session = session
        self._spawn = spawn  # the session's task group: a bug in a step ends the session
        self._task: asyncio.Task[None] | None = None
        self._wanted: tuple[np.ndarray, bool] | None = None  # the newest (speech, paused)

    def want(self, speech: np.ndarray, paused: bool) -> None:
        self._wanted = (speech, paused)
        if self._task is None or self._task.done():  # a failed one has ended the session
            self._task = self._spawn("hear", self._loop())

    async def _loop(self) -> None:
        while self._wanted is not None:
            (speech, paused), self._wanted = self._wanted, None
            try:
                await self._runtime.step(self._record, self._session.hear, speech, paused)
            except EngineError as exc:
                log.warning("early hearing of %s failed: %s", self._record.session_id, exc)

    async def stop(self) -> None:
        """No more early work: the step in flight finishes (one model step
        per session at a time), its error is the group's."""
        self._wanted = None
        if self._task is not None:
            task, self._task = self._task, None
            await asyncio.wait([task])
