"""The engine's duplex view in slots: one audio or omni duplex session of
the shared batch loop (:class:`~omnilive.engines.minicpmo.sessions.duplex.session.SlotDuplex`),
as the worker's unit loop calls it, and the thread hand-offs its units took."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.appends import ContextNote
from omnilive.engines.base import DuplexSession, EngineError
from omnilive.engines.messages import (
    ContextWindow,
    DuplexOptions,
    DuplexUnit,
    PrefillStats,
    UnitInput,
)
from omnilive.engines.minicpmo.appends import note_ids
from omnilive.engines.minicpmo.host import model_errors, system_prompt_parts
from omnilive.engines.minicpmo.runtime.batch import SlotError
from omnilive.engines.minicpmo.sessions.duplex.session import SlotDuplex
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitOutcome
from omnilive.engines.minicpmo.sessions.sampling import DUPLEX_SPEECH, DUPLEX_TEXT
from omnilive.engines.minicpmo.sessions.views import SlotEngine

log = logging.getLogger(__name__)


class SlotDuplexSession(DuplexSession):
    """One audio or omni duplex session in a slot of the shared batch loop."""

    def __init__(
        self,
        model: SlotEngine,
        default_voice: np.ndarray | None,
        settings: MiniCPMoSettings,
        force_listen_units: int | None = None,
    ) -> None:
        self._model = model
        self._default_voice = default_voice
        self._settings = settings
        self._force_listen_units = (
            settings.force_listen_units if force_listen_units is None else force_listen_units
        )
        self._session: SlotDuplex | None = None
        self._units = 0
        self._unit_start = 0
        self.handoffs = UnitHandoffs()

    async def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        self._leave()  # a second prepare starts over in a fresh slot
        try:
            slot = await self._model.batch.acquire()
        except SlotError:
            raise EngineError(
                f"every session slot of this GPU is live ({self._model.batch.steps.cache.slots})"
            ) from None
        self._session = SlotDuplex(
            self._model.shared,
            self._model.batch,
            slot,
            text=DUPLEX_TEXT,
            speech=DUPLEX_SPEECH,
            max_speak_tokens=self._settings.max_speak_tokens_per_unit,
            window=options.window or ContextWindow.of(self._settings.duplex_window),
        )
        llm_voice = options.llm_voice.reference if options.llm_voice else None
        tts_voice = options.tts_voice.reference if options.tts_voice else None
        llm_voice = llm_voice if llm_voice is not None else self._default_voice
        tts_voice = tts_voice if tts_voice is not None else llm_voice
        if not self._settings.audio_output:
            tts_voice = None
        prefix, suffix = system_prompt_parts(self._model.host, system_prompt, llm_voice is not None)
        self._units = 0
        with model_errors("duplex prepare"):
            return await self._session.prepare(prefix, suffix, llm_voice, tts_voice)

    def _require(self) -> SlotDuplex:
        if self._session is None:
            raise EngineError("duplex step before prepare")
        return self._session

    async def unit(self, given: UnitInput) -> tuple[PrefillStats, DuplexUnit]:
        """A unit as one request of the engine's threads (:meth:`SlotDuplex.unit`):
        they pass it along without returning to the event loop in between."""
        session = self._require()
        start, started = session.handoffs, time.perf_counter()
        forced = self._forced(given.force_listen)
        audio = np.asarray(given.audio, np.float32)
        with model_errors("duplex unit"):  # frames decoded off the loop, with the unit
            fed, outcome = await session.unit(
                audio, given.frames, given.max_slice_nums or 1, forced
            )
        self.handoffs.add(outcome.is_listen, session.handoffs - start)
        prefilled = max(session.prefilled, started)  # earlier: this unit fed nothing
        return self._stats(fed, (prefilled - started) * 1000), self._unit(outcome)

    async def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        session = self._require()
        self._unit_start = session.handoffs
        started = time.perf_counter()
        with model_errors("duplex prefill"):  # frames decoded off the loop, with the unit
            fed = await session.prefill(np.asarray(audio, np.float32), frames, max_slice_nums or 1)
        return self._stats(fed, (time.perf_counter() - started) * 1000)

    async def generate(self, force_listen: bool = False) -> DuplexUnit:
        session = self._require()
        forced = self._forced(force_listen)
        with model_errors("duplex generate"):
            outcome = await session.generate(forced)
        self.handoffs.add(outcome.is_listen, session.handoffs - self._unit_start)
        return self._unit(outcome)

    def _forced(self, force_listen: bool) -> bool:
        forced = force_listen or self._units < self._force_listen_units
        self._units += 1
        return forced

    @staticmethod
    def _stats(fed: dict[str, int], cost_ms: float) -> PrefillStats:
        return PrefillStats(
            vision_slices=fed["slices"],
            vision_tokens=fed["vision"],
            audio_tokens=fed["audio"],
            cost_ms=cost_ms,
        )

    def _unit(self, outcome: UnitOutcome) -> DuplexUnit:
        session = self._require()
        ledger = session.context.ledger if session.context is not None else None
        return DuplexUnit(
            is_listen=outcome.is_listen,
            text=outcome.text,
            audio=outcome.audio,
            end_of_turn=outcome.end_of_turn,
            kv_cache_length=outcome.kv_length,
            context_capacity=self._model.batch.steps.cache.capacity,
            evicted_units=ledger.evicted_units if ledger is not None else 0,
            n_tokens=len(outcome.decided),
            n_tts_tokens=len(outcome.speech_tokens),
            cost_llm_ms=outcome.llm_ms,
            cost_tts_ms=outcome.speech_ms,
            cost_token2wav_ms=outcome.vocoder_ms,
        )

    async def append(self, note: ContextNote) -> int:
        """On the event loop, between two units: the slot session only
        books the tokens, fed with its next unit's forward."""
        session = self._require()
        return session.append(note_ids(self._model.shared.tokenizer, note))

    async def finalize(self) -> None:
        session = self._require()
        with model_errors("duplex finalize"):
            await session.finalize()

    def close(self) -> None:
        """Give the slot back without waiting (from any thread: the worker
        runs a session's close as its last step)."""
        self._leave()

    def _leave(self) -> None:
        """Give the slot back (emptied) and drop the voice file."""
        session, self._session = self._session, None
        if session is not None:
            batch = self._model.batch
            try:
                batch.release_nowait(session.slot)
            except RuntimeError:  # the loop is closed: the slot goes with it
                log.info("minicpmo: slot %d left with its closed loop", session.slot)
            log.info(
                "slot %d released; %s; batch sizes %s, speech %s; busy %s; lane graphs %s",
                session.slot,
                self.handoffs,
                dict(batch.batch_sizes),
                dict(batch.speech_batch_sizes),
                batch.busy(),
                self._model.shared.lane_graphs(),
            )


@dataclass
class UnitHandoffs:
    """Thread hand-offs of a session's units, speaking and listening apart."""

    speak: int = 0
    speak_units: int = 0
    listen: int = 0
    listen_units: int = 0

    def add(self, is_listen: bool, handoffs: int) -> None:
        if is_listen:
            self.listen, self.listen_units = self.listen + handoffs, self.listen_units + 1
        else:
            self.speak, self.speak_units = self.speak + handoffs, self.speak_units + 1

    def __str__(self) -> str:
        speak = self.speak / max(1, self.speak_units)
        listen = self.listen / max(1, self.listen_units)
        return (
            f"thread hand-offs per speaking unit {speak:.1f} ({self.speak_units} units), "
            f"per listening unit {listen:.1f} ({self.listen_units} units)"
        )


# --- simplex views on the seat --------------------------------------------------------------
