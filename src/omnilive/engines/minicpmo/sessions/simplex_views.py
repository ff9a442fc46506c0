"""The engine's chat and half-duplex views when it has slots: each a
:class:`~omnilive.engines.minicpmo.sessions.simplex.SlotSimplex` in a slot of the
shared batch loop, its steps batched with every other live session's.

The worker calls these synchronously from its step threads; each call runs a
coroutine on the engine's event loop and waits (as the duplex view does), so
a slow session blocks only its own thread. A chat takes its slot at its
prefill and gives it back at its close; a half-duplex session holds one from
its prepare to its close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from omnilive.engines.base import (
    ChatMessage,
    ChatOptions,
    ChatSession,
    EngineError,
    GenerationOptions,
    HalfDuplexOptions,
    HalfDuplexSession,
    Interruptible,
    Part,
    TextAudioChunk,
    Voice,
)
from omnilive.engines.minicpmo.content import content_of
from omnilive.engines.minicpmo.reference.host import model_errors
from omnilive.engines.minicpmo.runtime.batch import SlotError
from omnilive.engines.minicpmo.sessions.simplex import SlotSimplex
from omnilive.engines.minicpmo.sessions.simplex_rules import AnswerSampling

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.sessions.views import SlotEngine

log = logging.getLogger(__name__)


@dataclass
class _Mark:
    """Where a conversation stood (a half-duplex snapshot)."""

    kv_length: int
    state: dict[str, Any]


_TURN_STATE = ("first", "new_user_msg", "llm_generated", "audio_chunk_idx")


class _SlotSimplexView:
    """What the chat and half-duplex views share: their slot, their voice,
    their answer streamed to the caller's thread."""

    def __init__(self, model: SlotEngine, default_voice: np.ndarray | None) -> None:
        self._model = model
        self._default_voice = default_voice
        self._session: SlotSimplex | None = None
        self._audio = False
        self._warnings: list[str] = []

    def _open(self) -> SlotSimplex:
        self._leave()
        model = self._model
        try:
            slot = model.events.run(model.batch.acquire())
        except SlotError:
            raise EngineError(
                f"every session slot of this GPU is live ({model.batch.steps.cache.slots})"
            ) from None
        self._session = SlotSimplex(
            model.shared,
            model.batch,
            slot,
            suppress_text_only=model.simplex_suppress_text_only,
        )
        return self._session

    def _require(self) -> SlotSimplex:
        if self._session is None:
            raise EngineError("this session has no context yet (prefill or prepare first)")
        return self._session

    def _voice_of(self, voice: Voice | None, want_audio: bool) -> np.ndarray | None:
        """The reference to speak in, or None: the answer is text only."""
        reference = voice.reference if voice is not None else None
        if reference is None:
            reference = self._default_voice
        self._audio = want_audio and self._model.host.settings.audio_output
        if self._audio and reference is None:
            log.warning("no reference voice (request or minicpmo.default_voice): text only")
            self._warnings.append("no reference voice to speak in: the answer is text only")
            self._audio = False
        return reference if self._audio else None

    def _answer(self, generation: GenerationOptions) -> Iterator[TextAudioChunk]:
        session = self._require()
        answer = session.answer(
            AnswerSampling.of(generation),
            generation.max_new_tokens,
            audio=self._audio,
            use_tts_template=self._audio,
            enable_thinking=generation.enable_thinking,
        )
        return Interruptible(self._stream(answer), session.interrupt)

    def _stream(self, answer: AsyncIterator[TextAudioChunk]) -> Iterator[TextAudioChunk]:
        events = self._model.events
        done = object()

        async def next_piece() -> Any:
            return await anext(answer, done)

        try:
            while True:
                with model_errors("generate"):
                    piece = events.run(next_piece())
                if piece is done:
                    return
                yield piece
        finally:
            try:
                events.run(answer.aclose())  # type: ignore[attr-defined]
            except Exception:  # the loop is closing: the answer goes with it
                log.exception("minicpmo: closing an answer failed")

    def _leave(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                self._model.events.run(self._model.batch.release(session.slot))
            except Exception:  # the loop is closing: the slot goes with it
                log.exception("minicpmo: releasing slot %d failed", session.slot)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)


async def _with_voice(session: SlotSimplex, reference: np.ndarray | None, work: Any) -> Any:
    """``work`` (a coroutine) while the voice is prepared beside it."""
    preparing = (
        asyncio.ensure_future(session.set_voice(reference)) if reference is not None else None
    )
    try:
        return await work
    finally:
        if preparing is not None:
            await preparing


class SlotChat(_SlotSimplexView, ChatSession):
    """One chat request: its messages prefilled into a fresh slot, one answer."""

    def __init__(self, model: SlotEngine, default_voice: np.ndarray | None) -> None:
        super().__init__(model, default_voice)
        self._generation = GenerationOptions()

    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        contents = [content_of(m.parts) for m in messages]  # fail before taking a slot
        session = self._open()
        reference = self._voice_of(options.voice, options.tts_enabled)
        self._generation = options.generation

        async def messages_in() -> int:
            length = 0
            for index, (message, content) in enumerate(zip(messages, contents, strict=True)):
                length = await session.prefill(
                    message.role,
                    content,
                    last=index == len(messages) - 1,
                    omni_mode=options.omni_mode,
                    max_slice_nums=options.max_slice_nums,
                    use_tts_template=self._audio,
                    enable_thinking=options.generation.enable_thinking,
                )
            return length

        with model_errors("prefill"):
            return self._model.events.run(_with_voice(session, reference, messages_in()))

    def generate(self) -> Iterator[TextAudioChunk]:
        return self._answer(self._generation)

    def close(self) -> None:
        self._leave()


class SlotHalfDuplex(_SlotSimplexView, HalfDuplexSession):
    """System content once, then per turn the user's speech and a streamed
    answer, the context kept in the session's slot across turns."""

    def __init__(self, model: SlotEngine, default_voice: np.ndarray | None) -> None:
        super().__init__(model, default_voice)
        self._options = HalfDuplexOptions()
        self._mark: _Mark | None = None
        self._pending = False

    def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        content = content_of(system)
        session = self._open()
        self._options = options
        reference = self._voice_of(options.voice, options.tts_enabled)
        work = session.prefill("system", content, use_tts_template=self._audio)
        with model_errors("prefill"):
            return self._model.events.run(_with_voice(session, reference, work))

    def prefill(self, speech: np.ndarray) -> int:
        session = self._require()
        before = session.kv_length
        work = session.prefill(
            "user",
            [np.asarray(speech, dtype=np.float32)],
            last=True,
            use_tts_template=self._audio,
        )
        with model_errors("prefill"):
            after = self._model.events.run(work)
        self._pending = True
        return after - before

    def generate(self) -> Iterator[TextAudioChunk]:
        if not self._pending:
            raise EngineError("generate before prefill")
        self._pending = False
        return self._answer(self._options.generation)

    def snapshot(self) -> None:
        session = self._require()
        state = {name: getattr(session, name) for name in _TURN_STATE}
        self._mark = _Mark(session.kv_length, state)

    def rollback(self) -> None:
        self._pending = False
        session, mark = self._session, self._mark
        if session is None or mark is None:
            return
        cache = self._model.batch.steps.cache
        with model_errors("rollback"):
            self._model.events.run(
                self._model.batch.call(cache.crop, session.slot, mark.kv_length, slot=session.slot)
            )
        session.kv_length = mark.kv_length
        for name, value in mark.state.items():
            setattr(session, name, value)

    def close(self) -> None:
        self._mark = None
        self._leave()
