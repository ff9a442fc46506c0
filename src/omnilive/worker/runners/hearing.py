"""What the runners with server VAD share while the user speaks: early work
(the speech so far goes to the engine's optional ``hear`` step: a
transcript, an answer started at a pause, with at most one such step in
flight and the newest request winning; optional, so an engine error in it
is logged and the turn's prefill does the work again), and turn-taking by
meaning (the worker's end-of-turn model judges a short silence)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from omnilive.engines.base import EngineError, HalfDuplexSession
from omnilive.vad import StreamingVad, TurnCheck, VadConfig, VadEvent
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
                await self._runtime.step(self._session.hear, speech, paused)
            except EngineError as exc:
                log.warning("early hearing of %s failed: %s", self._record.session_id, exc)

    async def stop(self) -> None:
        """No more early work: the step in flight finishes (one model step
        per session at a time), its error is the group's."""
        self._wanted = None
        if self._task is not None:
            task, self._task = self._task, None
            await asyncio.wait([task])


# --- turn-taking by meaning (the worker's end-of-turn model) -----------------------------


async def with_turn_checks(
    runtime: WorkerRuntime,
    config: VadConfig,
    rule_is_servers: bool = False,
    judges_words: bool = False,
) -> VadConfig:
    """``config`` with the end-of-turn model's checks, if the worker has one
    (and the session's silence rule is not already that short); an engine
    that ``judges_words`` is first checked after ``words_check_after_ms``. Where the
    client left the silence rule to the server (``rule_is_servers``), a turn
    whose words sound unfinished may wait up to ``unfinished_wait_ms``: the
    VAD's rule becomes that, and ``rule_silence_ms`` keeps the session's
    rule for the turns no words were judged for."""
    judge = runtime.turn_judge
    if judge is None or not await judge.ready():
        return config
    settings = judge.settings
    if settings.check_after_ms >= config.min_silence_duration_ms:
        return config
    first = settings.words_check_after_ms if judges_words else None
    config = dataclasses.replace(
        config,
        end_check_ms=settings.check_after_ms,
        first_check_ms=first if first is not None and first < settings.check_after_ms else None,
        end_confirmations=settings.confirmations,
    )
    if rule_is_servers and settings.unfinished_wait_ms > config.min_silence_duration_ms:
        config = dataclasses.replace(
            config,
            min_silence_duration_ms=settings.unfinished_wait_ms,
            rule_silence_ms=config.min_silence_duration_ms,
        )
    return config


async def judged_end(
    runtime: WorkerRuntime,
    record: SessionRecord,
    session: HalfDuplexSession,
    vad: StreamingVad | None,
    check: TurnCheck,
) -> VadEvent | None:
    """The end of a turn the models find finished (``SpeechEnded``, or
    ``SpeechDiscarded`` if too short); None while it is not (or not yet
    confirmed), or when the user has gone on speaking meanwhile. The engine
    judges the words it heard, where it can (``end_of_turn``)."""
    judge = runtime.turn_judge
    if judge is None or vad is None:
        return None
    try:
        words_p = await runtime.step(session.end_of_turn, check.speech)
    except EngineError as exc:  # optional: the audio model judges alone
        log.warning("judging the words of %s failed: %s", record.session_id, exc)
        words_p = None
    rule_ms = vad.config.rule_silence_ms
    if words_p is None and rule_ms is not None and check.silence_ms >= rule_ms:
        return vad.judged(check, True, settled=True)  # the session's rule, as without words
    verdict = await judge.complete(check.speech, words_p)
    return vad.judged(check, verdict.finished, verdict.settled)
