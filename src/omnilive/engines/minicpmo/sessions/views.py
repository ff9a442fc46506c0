"""Sessions in slots of one loaded MiniCPM-o: the engine's views, however many slots.

Duplex sessions (audio and omni, their view in ``duplex/view.py``) are
:class:`SlotDuplex` sessions, each in a slot of one :class:`BatchLoop`: their
LLM and speech-LM steps run batched with every other live session's on the
loop's thread; their encoder and vocoder calls run one at a time on the
loop's side lane (a second thread and CUDA stream), beside the batches. The
views' steps are coroutines: the worker awaits them on its own event loop (no
thread of its own per session, no second event loop), and every blocking
piece of work is a job of the batch loop or of a lane. Chat and half-duplex
sessions are slots of the same loop (``simplex/views.py``).

One fallback remains, for a checkpoint whose speech LM keeps its context in a
way ``simplex/session.py`` does not own: chat and half-duplex then run the
model's own simplex code, whose context lives on the model object, so one
such session at a time holds the *simplex seat*, and each of its steps (a
prefill, one piece of a streamed answer) runs on the side lane in turn with
the duplex sessions' encoder and vocoder calls: the duplex sessions keep
going while it talks, and no module state is touched by two threads."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from omnilive.engines.base import (
    ChatSession,
    EngineError,
    EngineUnavailable,
    HalfDuplexSession,
)
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    HalfDuplexOptions,
    Part,
    TextAudioChunk,
)
from omnilive.engines.minicpmo.host import Flavour, ModelHost
from omnilive.engines.minicpmo.runtime import turn_kernel
from omnilive.engines.minicpmo.runtime.lanes import LaneCall
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.tensors import clone_tensors
from omnilive.engines.minicpmo.sessions.duplex import speech_choice
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import (
    UnitRules,
)
from omnilive.engines.minicpmo.sessions.encoders.warm import warm_encoders
from omnilive.engines.minicpmo.sessions.shared import SharedModel
from omnilive.engines.minicpmo.sessions.simplex import speech_choice as chunk_speech_choice
from omnilive.engines.minicpmo.sessions.simplex.session import speech_supported
from omnilive.engines.minicpmo.sessions.simplex.speech import warm_answer_voices
from omnilive.engines.sync_views import SyncChatSession, SyncHalfDuplexSession

log = logging.getLogger(__name__)
T = TypeVar("T")

GIB = 2**30
# What a live session holds besides its preallocated contexts: the Whisper
# encoder's streaming cache, the vocoder's stream caches, a unit's activations
# (measured on an H200: ~0.1-0.2 GiB; benchmarks/gpu_density.py reports it).
SESSION_WORKING_BYTES = GIB // 4
# Positions of a turn's speech-LM context (about a minute of speech).
SPEECH_CAPACITY = 4096
# How long a chat or half-duplex session waits for the simplex seat.
SEAT_WAIT_S = 60.0


# --- sizing ---------------------------------------------------------------------------


def kv_bytes_per_position(config: Any, dtype_bytes: int) -> int:
    """Key and value bytes one position of a decoder's context takes."""
    heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * dtype_bytes


def slot_bytes(model: Any, context_length: int) -> int:
    """GPU memory one slot takes: its LLM context, its speech LM's, its working set."""
    llm = model.llm
    dtype_bytes = llm.lm_head.weight.element_size()
    total = kv_bytes_per_position(llm.config, dtype_bytes) * context_length
    tts = getattr(model, "tts", None)
    if tts is not None:
        speech_dtype = next(tts.model.parameters()).element_size()
        total += kv_bytes_per_position(tts.model.config, speech_dtype) * SPEECH_CAPACITY
    return total + SESSION_WORKING_BYTES


def plan_slots(
    free_bytes: int, headroom_bytes: int, per_slot: int, requested: int | None, cap: int
) -> int:
    """How many slots to allocate: ``requested``, or as many as fit (at most
    ``cap``). Raises :class:`EngineUnavailable`, with the numbers, when the
    requested count, or for an unset one a single slot, does not fit."""
    usable = free_bytes - headroom_bytes
    fits = max(0, usable // per_slot)
    wanted = 1 if requested is None else max(requested, 1)
    if wanted <= fits:
        return min(cap, fits) if requested is None else wanted
    raise EngineUnavailable(
        f"{wanted} session slot(s) need {wanted * per_slot / GIB:.1f} GiB of GPU "
        f"memory ({per_slot / GIB:.2f} GiB each) beyond {headroom_bytes / GIB:.1f} GiB of "
        f"headroom, but {free_bytes / GIB:.1f} GiB are free: {fits} fit. Lower "
        "minicpmo.slots or minicpmo.context_length"
    )


@dataclass
class SlotEngine:
    """What the slot views share: the model and its batch loop (with its lanes)."""

    host: ModelHost
    shared: SharedModel
    batch: BatchLoop
    seat: threading.Semaphore
    # Chat and half-duplex in slots (simplex_sessions), or on the seat (a
    # speech LM whose context handling simplex_slots does not own).
    simplex_in_slots: bool = True
    # The checkpoint's code masks the forbidden punctuation in text-only
    # answers too; the unified code only in spoken ones.
    simplex_suppress_text_only: bool = False

    @classmethod
    def build(cls, host: ModelHost, slots: int, context_length: int) -> SlotEngine:
        from omnilive.engines.minicpmo.sessions.shared import slot_loop

        unified = host.flavour is Flavour.UNIFIED
        rules = UnitRules.unified() if unified else UnitRules()
        shared = SharedModel.of_duplex(host.duplex, rules)
        shared.encoder_graphs = host.settings.encoder_graphs
        batch = slot_loop(host.model, slots, context_length, SPEECH_CAPACITY)
        in_slots = speech_supported(host.model)
        if not in_slots:
            log.warning(
                "the speech LM's attention (%s) is not owned here: chat and half-duplex "
                "run one at a time on the model's own code",
                getattr(host.model.tts, "attention_type", "?"),
            )
        return cls(
            host,
            shared,
            batch,
            threading.Semaphore(1),
            simplex_in_slots=in_slots,
            simplex_suppress_text_only=not unified,
        )

    async def warm_graphs(self, voice: np.ndarray | None = None) -> None:
        """Every batch and step bucket's CUDA graphs, captured before any
        session, and the encoders' for the batches they are likely to run;
        on CUDA, the vocoder's for answers in ``voice`` too."""
        started = time.perf_counter()
        captured = await self.batch.warm_graphs()
        log.info("%d step graphs captured in %.1f s", captured, time.perf_counter() - started)
        cache = self.batch.steps.cache  # a window's slides turn keys with a kernel of their own
        await self.batch.call(turn_kernel.warm, cache.keys[:, cache.idle])
        # The encoders' too, on their lane (warm_encoders logs them).
        await self.batch.encoder_call(warm_encoders, self.shared, self.batch.steps.cache.slots)
        if self.batch.speech is not None:  # the speech tokens' kernels, compiled
            head = self.host.model.tts.head_code[0].weight
            for warm in (speech_choice.warm, chunk_speech_choice.warm):
                await self.batch.call(warm, head.device, head.shape[0], [head.dtype])
            if voice is not None and self.shared.generate_audio and head.device.type == "cuda":
                calls = await self.batch.side_call(warm_answer_voices, self.shared, voice)
                log.info("vocoder warmed for answers: %d calls", calls)  # timed in its busy

    async def on_side_lane(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a step of the model's own code) on the side lane,
        in turn with the duplex sessions' encoder and vocoder calls."""
        return await self.batch.side_call(self._seat_step, fn, *args)

    def on_side_lane_nowait(self, fn: Callable[[], Any]) -> None:
        """``fn()`` on the side lane from any thread, awaited by nobody (a
        session's close): a failure is logged on the lane's thread."""
        side = self.batch.side
        if side is None:
            fn()
        else:
            side.jobs.put(LaneCall(fn=self._seat_step, args=(fn,)))

    def _seat_step(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            with self.shared.audio_state_lock:  # the model code's Whisper cache
                return fn(*args)
        finally:
            # The model code's stream caches may be views of the vocoder's
            # scratch buffers, which the next session's chunk overwrites:
            # copies, the seated session's own until its next step.
            vocoder = getattr(getattr(self.host.model, "tts", None), "audio_tokenizer", None)
            if getattr(vocoder, "stream_cache", None) is not None:
                vocoder.stream_cache = clone_tensors(vocoder.stream_cache)

    def close(self) -> None:
        self.batch.close()
        self.batch.thread.join(timeout=10)


# --- duplex ---------------------------------------------------------------------------------


class _Seated:
    """A simplex view of the model's own code, holding the simplex seat from
    its first step to its close, every step run on the model's side lane.

    The seat is taken at the first step, not when the view is made, and
    waited for off the event loop: the previous chat gives it back only when
    its close has run (a client who left mid-answer)."""

    def __init__(self, model: SlotEngine, inner: Any) -> None:
        self._model = model
        self._inner = inner  # the model code's chat or half-duplex view
        self._seated = False
        self._closed = False

    async def _sit(self) -> None:
        if self._seated:
            return
        if self._closed:
            raise EngineError("this session is closed")
        seat = self._model.seat
        if not seat.acquire(blocking=False) and not await asyncio.to_thread(
            seat.acquire, True, SEAT_WAIT_S
        ):
            raise EngineError(
                "another chat or half-duplex session holds this GPU's simplex seat "
                f"(one at a time beside the duplex slots) for over {SEAT_WAIT_S:.0f} s"
            )
        self._seated = True

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        await self._sit()
        return await self._model.on_side_lane(fn, *args)

    async def _stream(self, make: Callable[[], Iterator[T]]) -> AsyncGenerator[T, None]:
        """The iterator ``make()`` returns, each item made on the side lane."""
        iterator = await self._run(make)
        done = object()
        try:
            while (item := await self._run(next, iterator, done)) is not done:
                yield item
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                self._model.on_side_lane_nowait(close)

    async def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        async with aclosing(self._stream(self._inner.generate)) as items:
            async for item in items:
                yield item

    def close(self) -> None:
        self._stand_up(self._inner.close)

    @property
    def warnings(self) -> list[str]:
        return self._inner.warnings

    def _stand_up(self, close: Callable[[], None]) -> None:
        """The inner view's close on the side lane, then the seat back."""
        self._closed = True
        if not self._seated:
            return
        self._seated = False
        seat = self._model.seat

        def stand_up() -> None:
            try:
                close()
            finally:
                seat.release()

        self._model.on_side_lane_nowait(stand_up)


class SeatedChat(_Seated, ChatSession):
    def __init__(self, model: SlotEngine, inner: SyncChatSession) -> None:
        super().__init__(model, inner)

    async def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        return await self._run(self._inner.prefill, messages, options)


class SeatedHalfDuplex(_Seated, HalfDuplexSession):
    def __init__(self, model: SlotEngine, inner: SyncHalfDuplexSession) -> None:
        super().__init__(model, inner)

    async def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        return await self._run(self._inner.prepare, system, options)

    async def prefill(self, speech: np.ndarray) -> int:
        return await self._run(self._inner.prefill, speech)

    async def snapshot(self) -> None:
        await self._run(self._inner.snapshot)

    async def rollback(self) -> None:
        await self._run(self._inner.rollback)
