"""MiniCPM-o 4.5 on an NVIDIA GPU, loaded from a local checkpoint with its own code,
every session in a slot of one batch loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np

from omnilive.engine_settings import MiniCPMoSettings
from omnilive.engines.base import (
    Capabilities,
    ChatSession,
    DuplexSession,
    Engine,
    EngineError,
    HalfDuplexSession,
    ProgressCallback,
)
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    ContextWindow,
    DuplexOptions,
    GenerationOptions,
    Modality,
    TextPart,
    Voice,
)
from omnilive.engines.minicpmo.backend import Backend, TorchBackend, check_memory
from omnilive.engines.minicpmo.checkpoint import inspect_checkpoint
from omnilive.engines.minicpmo.content import load_voice
from omnilive.engines.minicpmo.host import ModelHost
from omnilive.engines.minicpmo.reference.chat import MiniCPMoChat
from omnilive.engines.minicpmo.reference.duplex import MiniCPMoDuplex
from omnilive.engines.minicpmo.reference.half_duplex import MiniCPMoHalfDuplex
from omnilive.engines.steps import Lane, StepLoop
from omnilive.engines.sync_views import (
    SyncChatSession,
    SyncDuplexSession,
    SyncHalfDuplexSession,
    on_lane,
)

if TYPE_CHECKING:  # the slot views import torch; the engine loads it only in load()
    from omnilive.config import Settings
    from omnilive.engines.minicpmo.sessions.views import SlotEngine

log = logging.getLogger(__name__)
# The worker's threads (the batch loop, the side lane, the sessions' event
# loop, the server's) share one interpreter lock, and CPython lets a thread
# keep it for up to its switch interval (5 ms by default) while another waits
# for it: the batch loop, which gives it up at every graph replay and
# synchronize, would wait that long each time a lane launches kernels.
GIL_SWITCH_S = 0.0005


def physical_gpu(device: str, visible: str | None) -> int | None:
    """The ``nvidia-smi`` index of torch device ``device`` (``cuda``, ``cuda:1``)
    under ``CUDA_VISIBLE_DEVICES`` (None when it names GPUs by UUID)."""
    if not device.startswith("cuda"):
        return None
    _, _, index_text = device.partition(":")
    index = int(index_text) if index_text.isdigit() else 0
    if not visible:
        return index
    names = [name.strip() for name in visible.split(",") if name.strip()]
    if index >= len(names) or not names[index].isdigit():
        return None
    return int(names[index])


# The context the reference implementation serves (its Realtime API ends a
# session there), which the oracle keeps; the LLM itself could hold more. Each
# slot holds minicpmo.context_length positions.
CONTEXT_LENGTH = 8192


class MiniCPMoEngine(Engine):
    """One MiniCPM-o model behind the chat, half-duplex and duplex views.

    Construction does nothing heavy; :meth:`load` checks the checkpoint and
    the GPU, loads the weights and the speech decoder, and warms every view
    up, so that the worker turns IDLE only when the first request will be
    fast. ``backend`` is the seam the contract tests use to inject a fake.

    It serves ``slots`` sessions at once (0: as many as fit in the GPU memory
    left after loading), their steps batched
    (:mod:`~omnilive.engines.minicpmo.sessions.views`); one slot is the same
    path at a batch of one. ``oracle`` instead serves every view through the
    model's own code, one session at a time (:mod:`.reference`): what the
    equality harnesses and the contract tests of that code hold the slots to.
    No setting reaches it.
    """

    name = "minicpmo"

    def __init__(
        self, settings: MiniCPMoSettings, backend: Backend | None = None, *, oracle: bool = False
    ) -> None:
        self._settings = settings
        self._backend: Backend = backend or TorchBackend()
        self._oracle = oracle
        self._host: ModelHost | None = None
        self._slots: SlotEngine | None = None
        self._default_voice: np.ndarray | None = None
        self.capabilities = Capabilities(
            input_modalities=frozenset({Modality.TEXT, Modality.IMAGE, Modality.AUDIO}),
            audio_output=settings.audio_output,
            voice_cloning=settings.audio_output,
            context_length=CONTEXT_LENGTH if oracle else settings.context_length,
            slots=1,  # until load() knows how many fit
            context_window=ContextWindow.of(settings.duplex_window),
        )

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings) -> MiniCPMoEngine:
        """The engine of ``settings.minicpmo`` (the registry's factory)."""
        return cls(settings.minicpmo)

    def load(self, progress: ProgressCallback) -> None:
        self._set_process_knobs()
        settings = self._settings
        progress("checking the checkpoint", 0.0)
        checkpoint = inspect_checkpoint(settings.model_path)
        if settings.default_voice is not None:
            self._default_voice = load_voice(settings.default_voice)
        progress("checking the GPU", 0.05)
        device = self._backend.check_device(settings.device)
        check_memory(device, checkpoint, settings.memory_headroom_gb)
        log.info(
            "loading %s (%.1f GiB of weights) on %s (%.1f GiB free)",
            checkpoint.path,
            checkpoint.weight_gib,
            device.name,
            device.free_bytes / 2**30,
        )
        model = self._backend.load_model(checkpoint, settings, progress)
        progress("loading the speech decoder", 0.7)
        host = ModelHost(model, settings, self._backend)
        host.setup()
        if settings.torch_compile:
            progress("compiling", 0.75)
            host.compile()
        self._host = host
        if not self._oracle:
            progress("allocating session slots", 0.78)
            self._allocate_slots(host)
        if settings.warmup:
            progress("warming up", 0.8)
            self._warm_up()
        progress("ready", 1.0)

    def _set_process_knobs(self) -> None:
        """The process-wide settings this engine runs under, made first in
        load(): a worker process holds one engine, and nothing else (an
        import, a view) changes them. The backend makes its library's own."""
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self._backend.configure_process()

    def _allocate_slots(self, host: ModelHost) -> None:
        from omnilive.engines.minicpmo.sessions.views import SlotEngine, plan_slots, slot_bytes

        settings = self._settings
        per_slot = slot_bytes(host.model, settings.context_length)
        free = self._backend.check_device(settings.device).free_bytes
        headroom = int(settings.memory_headroom_gb * 2**30)
        wanted = settings.slots or None  # 0: as many as fit
        slots = plan_slots(free, headroom, per_slot, wanted, settings.max_slots)
        self._slots = SlotEngine.build(host, slots, settings.context_length)
        self.capabilities = dataclasses.replace(self.capabilities, slots=slots)
        log.info(
            "%d session slots of %d positions (%.2f GiB each; %.1f GiB were free)",
            slots,
            settings.context_length,
            per_slot / 2**30,
            free / 2**30,
        )

    def _warm_up(self) -> None:
        """One short chat answer and one duplex unit, so that kernel selection,
        allocator growth and lazy imports happen before the first client. The
        views' steps are coroutines (the model code's on a lane of the
        warm-up's own, as the worker runs them): run here on an event loop
        that lives as long as the warm-up (the worker's loop is not serving yet)."""
        started = time.perf_counter()
        asyncio.run(self._warm_up_views())
        log.info("warm-up done in %.1f s", time.perf_counter() - started)

    async def _warm_up_views(self) -> None:
        if self._slots is not None:
            await self._slots.warm_graphs(self._default_voice)
        steps = StepLoop(1, name="minicpmo-warm-up")
        lane = steps.lane("warm-up")
        try:
            await self._warm_up_on(lane)
        finally:
            lane.finish()
            steps.close()

    async def _warm_up_on(self, lane: Lane) -> None:
        chat = on_lane(self.open_chat(), lane)
        try:
            options = ChatOptions(generation=GenerationOptions(max_new_tokens=8))
            await chat.prefill([ChatMessage("user", (TextPart("Hello."),))], options)
            async with aclosing(chat.generate()) as pieces:
                async for _ in pieces:
                    pass
        finally:
            chat.close()
        duplex = on_lane(self._duplex(force_listen_units=0), lane)
        try:
            await duplex.prepare("You are a helpful assistant.", DuplexOptions())
            noise = np.random.default_rng(0).normal(0, 0.01, 16_000).astype(np.float32)
            await duplex.prefill(noise, [])
            await duplex.generate()
            await duplex.finalize()
        finally:
            duplex.close()

    def close(self) -> None:
        if self._slots is not None:
            self._slots.close()
            self._slots = None
        if self._host is not None:
            self._host.release()
            self._host = None

    # --- views ---------------------------------------------------------------------

    def _require_host(self) -> ModelHost:
        if self._host is None:
            raise EngineError("the minicpmo engine is not loaded")
        return self._host

    def _duplex(self, force_listen_units: int | None = None) -> DuplexSession | SyncDuplexSession:
        if self._slots is not None:
            from omnilive.engines.minicpmo.sessions.duplex.view import SlotDuplexSession

            voice, settings = self._default_voice, self._settings
            return SlotDuplexSession(self._slots, voice, settings, force_listen_units)
        return MiniCPMoDuplex(self._require_host(), self._default_voice, force_listen_units)

    def open_chat(self) -> ChatSession | SyncChatSession:
        if self._slots is not None and self._slots.simplex_in_slots:
            from omnilive.engines.minicpmo.sessions.simplex.views import SlotChat

            return SlotChat(self._slots, self._default_voice)
        chat = MiniCPMoChat(self._require_host(), self._default_voice)
        if self._slots is None:
            return chat
        from omnilive.engines.minicpmo.sessions.views import SeatedChat

        return SeatedChat(self._slots, chat)

    def open_half_duplex(self) -> HalfDuplexSession | SyncHalfDuplexSession:
        if self._slots is not None and self._slots.simplex_in_slots:
            from omnilive.engines.minicpmo.sessions.simplex.views import SlotHalfDuplex

            return SlotHalfDuplex(self._slots, self._default_voice)
        half = MiniCPMoHalfDuplex(self._require_host(), self._default_voice)
        if self._slots is None:
            return half
        from omnilive.engines.minicpmo.sessions.views import SeatedHalfDuplex

        return SeatedHalfDuplex(self._slots, half)

    def open_duplex(self) -> DuplexSession | SyncDuplexSession:
        return self._duplex()

    def step_loop(self) -> StepLoop:
        """One thread, however many slots: the slot views are coroutines
        whose work runs on the batch loop and its lanes, so a session's lane
        runs only its close (and the oracle's one session, its steps)."""
        return StepLoop(1, name="minicpmo-lanes")

    def gpu_id(self) -> int | None:
        return physical_gpu(self._settings.device, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def default_voice(self) -> Voice | None:
        return Voice(reference=self._default_voice) if self._default_voice is not None else None
