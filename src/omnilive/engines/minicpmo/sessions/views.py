"""Many sessions on one loaded MiniCPM-o: the engine's views when ``slots > 1``.

Duplex sessions (audio and omni) are :class:`SlotDuplex` sessions, each in a
slot of one :class:`BatchLoop`: their LLM and speech-LM steps run batched with
every other live session's on the loop's thread; their encoder and vocoder
calls run one at a time on the loop's side lane (a second thread and CUDA
stream), beside the batches. The sessions themselves are coroutines on the
engine's own event loop (:class:`EngineLoop`); the worker calls the
synchronous engine API from its step threads, which submit to that loop and
wait, so that a slow session blocks only its own thread.

Chat and half-duplex run the model's own simplex code, whose context lives on
the model object: one such session at a time holds the *simplex seat*, and
each of its steps (a prefill, one piece of a streamed answer) runs on the side
lane in turn with the duplex sessions' encoder and vocoder calls, so the
duplex sessions keep going while it talks, and no module state is touched by
two threads.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from omnilive.config import MiniCPMoSettings
from omnilive.engines.base import (
    ChatMessage,
    ChatOptions,
    ChatSession,
    DuplexOptions,
    DuplexSession,
    DuplexUnit,
    EngineError,
    EngineUnavailable,
    HalfDuplexOptions,
    HalfDuplexSession,
    Part,
    PrefillStats,
    TextAudioChunk,
)
from omnilive.engines.minicpmo.content import VoiceFile, image_of
from omnilive.engines.minicpmo.reference.duplex import system_prompt_parts
from omnilive.engines.minicpmo.reference.host import Flavour, ModelHost, model_errors
from omnilive.engines.minicpmo.runtime.batch import SlotError
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.tensors import clone_tensors
from omnilive.engines.minicpmo.sessions.duplex import SlotDuplex
from omnilive.engines.minicpmo.sessions.shared import SharedModel
from omnilive.engines.minicpmo.sessions.simplex import speech_supported
from omnilive.engines.minicpmo.sessions.unit_rules import SpeechSampling, TextSampling, UnitRules

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
# The worker's threads (the batch loop, the side lane, the sessions' event
# loop, the server's) share one interpreter lock, and CPython lets a thread
# keep it for up to its switch interval (5 ms by default) while another waits
# for it: the batch loop, which gives it up at every graph replay and
# synchronize, would wait that long each time a lane launches kernels.
GIL_SWITCH_S = 0.0005


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
    ``cap``; 0 when none does: the engine then serves one session at a time
    on the model's own code). Raises :class:`EngineUnavailable` when a
    requested count does not fit."""
    usable = free_bytes - headroom_bytes
    fits = max(0, usable // per_slot)
    if requested is None:
        return min(cap, fits)
    wanted = requested
    if wanted < 1 or wanted > fits:
        wanted = max(wanted, 1)
        raise EngineUnavailable(
            f"{wanted} session slot(s) need {wanted * per_slot / GIB:.1f} GiB of GPU "
            f"memory ({per_slot / GIB:.2f} GiB each) beyond {headroom_bytes / GIB:.1f} GiB of "
            f"headroom, but {free_bytes / GIB:.1f} GiB are free: {fits} fit. Lower "
            "minicpmo.slots or minicpmo.context_length"
        )
    return wanted


# --- the engine's event loop -------------------------------------------------------------


class EngineLoop:
    """An asyncio event loop on a thread of its own, where the slot sessions'
    coroutines run; :meth:`run` is the synchronous way in."""

    def __init__(self, name: str = "minicpmo-sessions") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            # Closed, not just stopped: a loop left to the garbage collector
            # warns (and fails a test that happens to be running then).
            self.loop.close()


@dataclass
class SlotEngine:
    """What the slot views share: the model, its batch loop and event loop."""

    host: ModelHost
    shared: SharedModel
    batch: BatchLoop
    events: EngineLoop
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
        batch = slot_loop(host.model, slots, context_length, SPEECH_CAPACITY)
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        # No cuDNN attention in this process: it builds an execution plan for
        # every new shape (on an H200 up to ~0.8 s the first time), and the
        # encoders' shapes keep changing (a session's Whisper cache grows by
        # a chunk every second; each reference voice has its own length). The
        # switch is process-wide (torch's sdpa_kernel() is not per thread), so
        # it is made once, before any step graph is captured.
        torch.backends.cuda.enable_cudnn_sdp(False)
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
            EngineLoop(),
            threading.Semaphore(1),
            simplex_in_slots=in_slots,
            simplex_suppress_text_only=not unified,
        )

    def warm_graphs(self) -> None:
        """Every batch and step bucket's CUDA graphs, captured before any session."""
        started = time.perf_counter()
        captured = self.events.run(self.batch.warm_graphs())
        log.info("%d step graphs captured in %.1f s", captured, time.perf_counter() - started)

    def on_side_lane(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a step of the model's own code) on the side lane,
        in turn with the duplex sessions' encoder and vocoder calls."""
        return self.events.run(self.batch.side_call(self._seat_step, fn, *args))

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
        self.events.close()


# --- duplex ---------------------------------------------------------------------------------


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
        self._voice_file: VoiceFile | None = None
        self._units = 0

    def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        self._leave()  # a second prepare starts over in a fresh slot
        events = self._model.events
        try:
            slot = events.run(self._model.batch.acquire())
        except SlotError:
            raise EngineError(
                f"every session slot of this GPU is live ({self._model.batch.steps.cache.slots})"
            ) from None
        self._session = SlotDuplex(
            self._model.shared,
            self._model.batch,
            slot,
            text=TextSampling(),  # its defaults are the reference's duplex sampling
            speech=SpeechSampling(),
            max_speak_tokens=self._settings.max_speak_tokens_per_unit,
        )
        llm_voice = options.llm_voice.reference if options.llm_voice else None
        tts_voice = options.tts_voice.reference if options.tts_voice else None
        llm_voice = llm_voice if llm_voice is not None else self._default_voice
        tts_voice = tts_voice if tts_voice is not None else llm_voice
        if tts_voice is not None and self._settings.audio_output:
            self._voice_file = VoiceFile(tts_voice)
        prefix, suffix = system_prompt_parts(self._model.host, system_prompt, llm_voice is not None)
        prompt_wav = str(self._voice_file.path) if self._voice_file else None
        self._units = 0
        with model_errors("duplex prepare"):
            return events.run(self._session.prepare(prefix, suffix, llm_voice, prompt_wav))

    def _require(self) -> SlotDuplex:
        if self._session is None:
            raise EngineError("duplex step before prepare")
        return self._session

    def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        session = self._require()
        images = [image_of(frame) for frame in frames]
        started = time.perf_counter()
        with model_errors("duplex prefill"):
            fed = self._model.events.run(
                session.prefill(np.asarray(audio, np.float32), images, max_slice_nums or 1)
            )
        return PrefillStats(
            vision_slices=fed["slices"],
            vision_tokens=fed["vision"],
            audio_tokens=fed["audio"],
            cost_ms=(time.perf_counter() - started) * 1000,
        )

    def generate(self, force_listen: bool = False) -> DuplexUnit:
        session = self._require()
        forced = force_listen or self._units < self._force_listen_units
        self._units += 1
        with model_errors("duplex generate"):
            outcome = self._model.events.run(session.generate(forced))
        return DuplexUnit(
            is_listen=outcome.is_listen,
            text=outcome.text,
            audio=outcome.audio,
            end_of_turn=outcome.end_of_turn,
            kv_cache_length=outcome.kv_length,
            n_tokens=len(outcome.decided),
            n_tts_tokens=len(outcome.speech_tokens),
            cost_llm_ms=outcome.llm_ms,
            cost_tts_ms=outcome.speech_ms,
            cost_token2wav_ms=outcome.vocoder_ms,
        )

    def finalize(self) -> None:
        session = self._require()
        with model_errors("duplex finalize"):
            self._model.events.run(session.finalize())

    def close(self) -> None:
        self._leave()

    def _leave(self) -> None:
        """Give the slot back (emptied) and drop the voice file."""
        session, self._session = self._session, None
        if session is not None:
            batch = self._model.batch
            try:
                self._model.events.run(batch.release(session.slot))
            except Exception:  # the loop is closing: the slot goes with it
                log.exception("minicpmo: releasing slot %d failed", session.slot)
            log.info(
                "slot %d released; batch sizes %s, speech %s; busy %s",
                session.slot,
                dict(batch.batch_sizes),
                dict(batch.speech_batch_sizes),
                batch.busy(),
            )
        if self._voice_file is not None:
            self._voice_file.close()
            self._voice_file = None


# --- simplex views on the seat --------------------------------------------------------------


class _Seated:
    """A simplex view of the model's own code, holding the simplex seat from
    its first step to its close, every step run on the model's side lane.

    The seat is taken at the first step, not when the view is made: views are
    made on the worker's event loop, and waiting there for a seat that the
    previous chat gives back only when that loop runs its close (a client who
    left mid-answer) would stop the worker."""

    def __init__(self, model: SlotEngine) -> None:
        self._model = model
        self._seated = False
        self._closed = False

    def _sit(self) -> None:
        if self._seated:
            return
        if self._closed:
            raise EngineError("this session is closed")
        if not self._model.seat.acquire(timeout=SEAT_WAIT_S):
            raise EngineError(
                "another chat or half-duplex session holds this GPU's simplex seat "
                f"(one at a time beside the duplex slots) for over {SEAT_WAIT_S:.0f} s"
            )
        self._seated = True

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        self._sit()
        return self._model.on_side_lane(fn, *args)

    def _stream(self, make: Callable[[], Iterator[T]]) -> Iterator[T]:
        """The iterator ``make()`` returns, each item made on the side lane."""
        iterator = self._run(make)
        done = object()
        try:
            while (item := self._run(next, iterator, done)) is not done:
                yield item  # type: ignore[misc]
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                self._run(close)

    def _stand_up(self, close: Callable[[], None]) -> None:
        self._closed = True
        if not self._seated:
            return
        self._seated = False
        try:
            self._model.on_side_lane(close)
        finally:
            self._model.seat.release()


class SeatedChat(_Seated, ChatSession):
    def __init__(self, model: SlotEngine, inner: ChatSession) -> None:
        super().__init__(model)
        self._inner = inner

    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        return self._run(self._inner.prefill, messages, options)

    def generate(self) -> Iterator[TextAudioChunk]:
        return self._stream(self._inner.generate)

    def close(self) -> None:
        self._stand_up(self._inner.close)

    @property
    def warnings(self) -> list[str]:
        return self._inner.warnings


class SeatedHalfDuplex(_Seated, HalfDuplexSession):
    def __init__(self, model: SlotEngine, inner: HalfDuplexSession) -> None:
        super().__init__(model)
        self._inner = inner

    def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        return self._run(self._inner.prepare, system, options)

    def prefill(self, speech: np.ndarray) -> int:
        return self._run(self._inner.prefill, speech)

    def generate(self) -> Iterator[TextAudioChunk]:
        return self._stream(self._inner.generate)

    def snapshot(self) -> None:
        self._run(self._inner.snapshot)

    def rollback(self) -> None:
        self._run(self._inner.rollback)

    def close(self) -> None:
        self._stand_up(self._inner.close)
