"""What the duplex sessions of one loaded MiniCPM-o share: its modules and
their timing (:class:`SharedModel`), the batch loop over its LLM and speech LM
(:func:`slot_loop`), and the helpers that give each session its own copy of a
shared module's state for the length of a call."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnilive.engines.minicpmo.content import KeptVoices, VoiceFile
from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, SlotCache
from omnilive.engines.minicpmo.runtime.block_graphs import BlockGraphs
from omnilive.engines.minicpmo.runtime.fused_decoder import FusedDecoder
from omnilive.engines.minicpmo.runtime.lanes import SideLane
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.tensors import swapped
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import DuplexVocab, UnitRules
from omnilive.engines.minicpmo.sessions.encoders.vision import Layers, encoder_layers, fused_vision
from omnilive.engines.minicpmo.sessions.encoders.whisper_batch import batchable
from omnilive.engines.minicpmo.sessions.encoders.whisper_graphs import WhisperGraphs
from omnilive.engines.minicpmo.sessions.voice.vocoder import VoiceStream, runner_for

log = logging.getLogger(__name__)


@dataclass
class SharedModel:
    """What every session of one loaded model uses: its modules (``model``:
    the model code's ``MiniCPMO``), tokenizer, processor and timing."""

    model: Any
    tokenizer: Any
    processor: Any
    rules: UnitRules
    generate_audio: bool = True
    chunk_ms: int = 1000
    first_chunk_ms: int = 1035
    cnn_redundancy_ms: int = 20
    # The vision encoder and Whisper through CUDA graphs (minicpmo.encoder_graphs).
    encoder_graphs: bool = True
    vocab: DuplexVocab = field(init=False)
    # The audio feature extractor's log-mel floor as loaded: the streaming mel
    # processors switch the shared extractor's mode as their audio grows, so a
    # voice prompt's features are made with this one, as a fresh model makes them.
    voice_mel_mode: dict[str, Any] = field(init=False)
    mel_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    # The processor for whole recordings (see recordings_processor).
    prompt_processor: Any = field(init=False)
    prompt_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    # Held while the model's Whisper cache attribute is in use: a slot
    # session's encoder call swaps its own in (on the encoders' lane) and the
    # model code's simplex steps (on the side lane) use the attribute too.
    audio_state_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    # The vocoder's chunk runner (vocoder.runner_for), made by the first voice.
    vocoder: Any = field(init=False, default=None)
    # The vision encoder's layers as CUDA graphs (see vision_layers); on the
    # encoders' lane.
    vision_graphs: BlockGraphs | None = field(init=False, default=None)
    # Whisper between its attentions as CUDA graphs (see audio_graphs); on the
    # encoders' lane.
    whisper_graphs: WhisperGraphs | None = field(init=False, default=None)
    # Voices prepared for the vocoder: (the voice file, the runner's state at
    # a turn's start), by their samples (see open_voice); used on the side lane.
    voices: KeptVoices[tuple[Any, Any]] = field(
        init=False, default_factory=lambda: KeptVoices(forget=lambda kept: kept[0].close())
    )
    # A reference voice's audio embeddings for a system turn, by its samples;
    # used on the encoders' lane.
    voice_embeddings: KeptVoices[torch.Tensor] = field(init=False, default_factory=KeptVoices)
    markers: dict[int, torch.Tensor] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.vocab = DuplexVocab.of(self.tokenizer)
        extractor = getattr(self.processor, "audio_processor", None)
        self.voice_mel_mode = {
            name: getattr(extractor, name)
            for name in ("dynamic_log_norm", "dynamic_range_db", "log_floor_db")
            if hasattr(extractor, name)
        }
        self.prompt_processor = self.processor
        if extractor is not None:
            self.prompt_processor = copy.copy(self.processor)
            self.prompt_processor.audio_processor = copy.deepcopy(extractor)

    @classmethod
    def of_duplex(cls, duplex: Any, rules: UnitRules) -> SharedModel:
        """The shared parts of a model-code duplex object (either flavour)."""
        return cls(
            model=duplex.model,
            tokenizer=duplex.tokenizer,
            processor=duplex.processor,
            rules=rules,
            generate_audio=bool(duplex.generate_audio),
            chunk_ms=int(getattr(duplex, "CHUNK_MS", 1000)),
            first_chunk_ms=int(getattr(duplex, "FIRST_CHUNK_MS", 1035)),
            cnn_redundancy_ms=int(getattr(duplex, "CNN_REDUNDANCY_MS", 20)),
        )

    def voice_runner(self) -> Any:
        """The vocoder's chunk runner (one per model: its graphs are shared),
        made at the first use (on the side lane)."""
        if self.vocoder is None:
            self.vocoder = runner_for(self.model.tts.audio_tokenizer)
        return self.vocoder

    def vision_layers(self) -> Layers | None:
        """The vision encoder's layers through CUDA graphs (on CUDA, where
        :mod:`~omnilive.engines.minicpmo.sessions.encoders.vision` restates the
        model's encoder) where ``encoder_graphs`` is on, made at the first
        use; None: eager."""
        if self.vision_graphs is None and self._encoder_graphs_on() and fused_vision(self.model):
            self.vision_graphs = BlockGraphs(encoder_layers(self.model.vpm), "the vision encoder")
        return self.vision_graphs

    def audio_graphs(self) -> WhisperGraphs | None:
        """The streaming Whisper encoder through CUDA graphs (on CUDA, where
        :mod:`~omnilive.engines.minicpmo.sessions.encoders.whisper_batch` restates the
        model's encoder, unless in float16) where ``encoder_graphs`` is on,
        made at the first use; None: eager."""
        model = self.model
        if (
            self.whisper_graphs is None
            and self._encoder_graphs_on()
            and batchable(model)
            and model.apm.conv1.weight.dtype != torch.float16
        ):
            self.whisper_graphs = WhisperGraphs(model)
        return self.whisper_graphs

    def _encoder_graphs_on(self) -> bool:
        return self.encoder_graphs and self.device.type == "cuda"

    def lane_graphs(self) -> dict[str, dict[str, float]]:
        """The lanes' CUDA graphs' counts, by part: the vocoder's (none
        before the first voice), the vision encoder's (none before the first
        frame) and Whisper's."""
        stats = getattr(self.vocoder, "graph_stats", None)
        parts = stats() if stats is not None else {}
        for name, graphs in (("vision", self.vision_graphs), ("whisper", self.whisper_graphs)):
            if graphs is not None:
                parts[name] = graphs.stats()
        return parts

    def open_voice(self, samples: np.ndarray, whole_seconds: bool) -> Any:
        """A :class:`~.vocoder.VoiceStream` of ``samples`` (16 kHz; on the
        side lane): the vocoder's preparation of them, or the kept one of the
        same samples. Sessions mostly speak in the server's default voice, and
        a preparation holds the side lane for ~0.2 s on an H100: twelve
        sessions starting at once held every session's voice back ~2.5 s."""
        runner = self.voice_runner()

        def prepare(samples: np.ndarray) -> tuple[VoiceFile, Any]:
            file = VoiceFile(samples)
            return file, runner.open(str(file.path))

        _, base = self.voices.get(samples, prepare)
        return VoiceStream(runner, base=base, whole_seconds=whole_seconds)

    def kept_voice(self, samples: np.ndarray, whole_seconds: bool) -> VoiceStream | None:
        """:meth:`open_voice` of ``samples`` where their preparation is kept,
        without the side lane (it makes nothing on the GPU: any thread), else
        None. A chat's or a session's start waited for the side lane's
        running vocoder call (100-250 ms with eight first pieces) to take
        ~1 ms of it."""
        kept = self.voices.peek(samples) if self.vocoder is not None else None
        if kept is None:
            return None
        return VoiceStream(self.vocoder, base=kept[1], whole_seconds=whole_seconds)

    async def voice_stream(
        self,
        samples: np.ndarray,
        whole_seconds: bool,
        side_call: Callable[..., Awaitable[VoiceStream]],
    ) -> VoiceStream:
        """The voice of ``samples``: :meth:`kept_voice` (no lane to wait for),
        else :meth:`open_voice` by ``side_call`` (the session's side lane)."""
        voice = self.kept_voice(samples, whole_seconds)
        if voice is None:
            voice = await side_call(self.open_voice, samples, whole_seconds)
        return voice

    @property
    def device(self) -> torch.device:
        return self.model.llm.lm_head.weight.device

    def embed(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, device=self.device)
        with torch.no_grad():
            return self.model.llm.get_input_embeddings()(ids)

    def marker(self, token: int) -> torch.Tensor:
        """``[1, hidden]``: the embedding of a structural token (``<unit>``,
        ``<image>``, ``<slice>`` and their ends), looked up once: every unit
        and frame needs them, and each lookup copies its id to the GPU, which
        waits for the work queued on the calling thread's stream."""
        cached = self.markers.get(token)
        if cached is None:
            cached = self.markers[token] = self.embed([token])
        return cached

    @contextlib.contextmanager
    def recordings_processor(self) -> Iterator[Any]:
        """The processor for whole recordings (chats' prompts, reference
        voices), held: the shared tokenizer and image processor with a
        feature extractor of its own, in :attr:`voice_mel_mode` (read at each
        call: the equality harness sets it after the model is shared). On
        the shared extractor a prompt's processing (tokens, images, mel) held
        ``mel_lock``, which every duplex session's streaming mel takes each
        second."""
        processor = self.prompt_processor
        with self.prompt_lock, swapped(processor.audio_processor, dict(self.voice_mel_mode)):
            yield processor

    def new_mel(self) -> Any:
        """A streaming mel processor of the session's own (the model's
        ``init_streaming_processor`` settings), made without disturbing the
        shared processor's."""
        with self.mel_lock:
            return self._new_mel(self.processor)

    def _new_mel(self, processor: Any) -> Any:
        before = getattr(processor, "_streaming_mel_processor", None)
        try:
            processor.set_streaming_mode(
                mode="exact",
                chunk_ms=self.chunk_ms,
                first_chunk_ms=self.first_chunk_ms,
                cnn_redundancy_ms=self.cnn_redundancy_ms,
                enable_sliding_window=True,
                slide_trigger_seconds=30.0,
                slide_stride_seconds=10.0,
            )
            mel = processor._streaming_mel_processor
            mel.reset()
            return mel
        finally:
            processor._streaming_mel_processor = before


# Attention width buckets (SlotCache): each is a set of CUDA graphs, captured
# the first time a session's context reaches it (~100 ms a graph, holding
# every session's step; BatchLoop.warm_graphs takes the first width's at
# start). Coarse, because reading masked columns is cheap: a decode step over
# 2,048 columns instead of 512 reads ~230 MB more K/V per row (Qwen3-8B's 36
# layers), ~50 us on an H200, beside ~16 GB of weights (~3.5 ms) a step.
LLM_WIDTH_BUCKET = 2048
SPEECH_WIDTH_BUCKET = 1024
# Threads for the CPU halves of units with frames (JPEG decoding, the image
# processor, the mel features: ~0.2 CPU s/s at 12 omni sessions on an H100
# host, ~24 ms a unit), beside the encoders' lane, which that work would load.
PREP_THREADS = 4
CPU = torch.device("cpu")


def slot_loop(
    model: Any,
    slots: int,
    capacity: int,
    speech_capacity: int = 4096,
    *,
    graphs: bool | None = None,
) -> BatchLoop:
    """The batch loop of one loaded model (the model code's ``MiniCPMO``):
    ``slots`` sessions of up to ``capacity`` LLM positions each and, where the
    model speaks, as many speech LM contexts of ``speech_capacity`` positions
    (a turn's speech). All of it allocated now: a session that joins later
    needs no more memory for its contexts."""
    llm = model.llm
    weight = llm.lm_head.weight
    device, dtype = weight.device, weight.dtype
    cache = SlotCache(
        llm.config, slots, capacity, bucket=LLM_WIDTH_BUCKET, device=device, dtype=dtype
    )
    steps = BatchedSteps(llm.model, cache, head=llm.lm_head, decoder=fused_decoder(llm.model))
    speech = None
    tts = getattr(model, "tts", None)
    if tts is not None:
        param = next(tts.model.parameters())
        speech_cache = SlotCache(
            tts.model.config,
            slots,
            speech_capacity,
            bucket=SPEECH_WIDTH_BUCKET,
            device=param.device,
            dtype=param.dtype,
        )
        speech = BatchedSteps(
            tts.model,
            speech_cache,
            head=tts.head_code[0],
            embedding=tts.emb_code[0],
            decoder=fused_decoder(tts.model),
        )
    return BatchLoop(
        steps,
        speech=speech,
        graphs=graphs,
        side=SideLane(device),
        encoders=SideLane(device, "minicpmo-encoders", random_draws=False),
        prep=SideLane(CPU, "minicpmo-prep", random_draws=False, threads=PREP_THREADS),
    )


def fused_decoder(backbone: Any) -> FusedDecoder | None:
    """The fused forward of ``backbone`` (kernels on CUDA, its torch path on
    the CPU), or ``None`` where it does not apply: the stock forward runs."""
    device = next(backbone.parameters()).device
    try:
        return FusedDecoder(backbone, use_kernels=device.type == "cuda")
    except ValueError as exc:  # a decoder it does not run
        log.warning("batched steps run the model's own forward: %s", exc)
        return None
