"""A session's voice: its speech tokens to audio a second at a time, on the
model's one streaming vocoder (``stepaudio2.Token2wav``: a flow-matching
model, then HiFT), with stream caches of the session's own.

The vocoder's own ``stream()`` keeps one stream's caches on the object, and
some of them are views of the flow's scratch buffers, which its next call
overwrites: two sessions cannot share it as it is. :class:`FlowRunner` runs a
chunk from a session's caches and hands back new ones that are the session's
alone, with the same steps as ``stream()`` (the flow's ``inference_chunk``,
the caches cut back to the prompt plus 100 frames, HiFT with its mel and
source caches, the cross-fade, the held-back tail). On CUDA the flow
estimator's blocks, run ten times a chunk and nearly all of its thousands of
small kernels, are a CUDA graph per cache shape (captured the second time a
shape comes, so the first is its warm-up). :class:`ModelCodeRunner` calls the
vocoder's own ``stream()`` with the session's caches swapped in (and copied
out after, breaking the aliasing); it serves vocoders without a flow model
(the test stand-ins).

Everything here runs on the model's side lane, one call at a time.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from omnilive.engines.minicpmo.batch_graphs import CAPTURE_LOCK
from omnilive.engines.minicpmo.slot_model import clone_tensors, swapped
from omnilive.engines.minicpmo.unit_rules import SILENCE_TOKEN

log = logging.getLogger(__name__)

OUT_RATE = 24_000
VOCODER_CHUNK = 25  # speech tokens per chunk (one second)
PROMPT_TAIL_FRAMES = 100  # the flow's caches keep the prompt plus this many frames
MAX_GRAPHS = 8  # captured chunk shapes kept (a voice needs about four)


class ChunkRunner(Protocol):
    lookahead: int

    def open(self, prompt_wav: str) -> Any:
        """A voice's state at the start of a turn (never changed after)."""

    def chunk(self, state: Any, tokens: list[int], last: bool) -> tuple[np.ndarray, Any]:
        """``tokens`` (with the lookahead, unless ``last``) to samples, and the
        state after them (``state`` itself is left as it was)."""


def runner_for(token2wav: Any, graphs: bool | None = None) -> ChunkRunner:
    """The runner for a loaded vocoder: the flow runner where it has a flow
    model and HiFT, else the model code's own ``stream()``."""
    flow = getattr(token2wav, "flow", None)
    if hasattr(flow, "inference_chunk") and hasattr(token2wav, "hift"):
        return FlowRunner(token2wav, graphs=graphs)
    return ModelCodeRunner(token2wav)


class VoiceStream:
    """One session's voice: the tokens not voiced yet and the vocoder state
    of the running turn, restarted from the voice's base at each turn."""

    def __init__(self, runner: ChunkRunner, prompt_wav: str) -> None:
        self.runner = runner
        self.base = runner.open(prompt_wav)
        self.live: Any = None
        self.buffer: list[int] = []
        self.restart()

    def restart(self) -> None:
        self.live = self.base
        self.buffer = [SILENCE_TOKEN] * 3

    def push(self, tokens: list[int], last: bool, flush: bool) -> np.ndarray | None:
        """Voice ``tokens``: each whole second (25 tokens plus the lookahead)
        buffered so far, or with ``flush`` whatever is enough for a chunk;
        ``last`` voices the rest and restarts the turn. Under a second of
        audio (not at the end) is padded in front to one second."""
        self.buffer += tokens
        lookahead = self.runner.lookahead
        step = VOCODER_CHUNK + lookahead
        pcm: list[np.ndarray] = []
        if flush:
            while len(self.buffer) >= lookahead + 5:
                take = min(step, len(self.buffer))
                pcm.append(self._chunk(self.buffer[:take], last=False))
                self.buffer = self.buffer[min(VOCODER_CHUNK, take - lookahead) :]
        else:
            while len(self.buffer) >= step:
                pcm.append(self._chunk(self.buffer[:step], last=False))
                self.buffer = self.buffer[VOCODER_CHUNK:]
        if last and self.buffer:
            pcm.append(self._chunk(self.buffer, last=True))
            self.buffer = []
        if last:
            self.restart()
        if not pcm:
            return None
        samples = np.concatenate(pcm)
        if not last and len(samples) < OUT_RATE:
            samples = np.pad(samples, (OUT_RATE - len(samples), 0))
        return samples

    def _chunk(self, tokens: list[int], last: bool) -> np.ndarray:
        samples, self.live = self.runner.chunk(self.live, tokens, last)
        return samples


# --- the model code's stream() ------------------------------------------------------------


class ModelCodeRunner:
    """The vocoder's own ``stream()`` over a session's swapped-in caches."""

    def __init__(self, token2wav: Any) -> None:
        self.token2wav = token2wav
        self.lookahead = int(token2wav.flow.pre_lookahead_len)

    def open(self, prompt_wav: str) -> dict[str, Any]:
        vocoder = self.token2wav
        state = {"cache": None, "stream_cache": None, "hift_cache_dict": {}}
        with swapped(vocoder, state):  # the caches come back into ``state``
            vocoder.stream_cache, vocoder.hift_cache_dict = vocoder.set_stream_cache(prompt_wav)
        state["prompt_wav"] = prompt_wav
        return clone_tensors(state)

    def chunk(self, state: dict[str, Any], tokens: list[int], last: bool) -> tuple[np.ndarray, Any]:
        vocoder = self.token2wav
        live = {name: value for name, value in state.items() if name != "prompt_wav"}
        with swapped(vocoder, live):
            pcm = vocoder.stream(tokens, prompt_wav=state["prompt_wav"], last_chunk=last)
        # Copies: what stream() left may be views of the flow's scratch buffers.
        after = clone_tensors(live)
        after["prompt_wav"] = state["prompt_wav"]
        return _samples(pcm), after


def _samples(pcm: Any) -> np.ndarray:
    """The vocoder's output (int16 PCM bytes, or a waveform) as float32 samples."""
    if isinstance(pcm, bytes | bytearray):
        return np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0
    if hasattr(pcm, "detach"):
        pcm = pcm.detach().float().cpu().numpy()
    return np.asarray(pcm, dtype=np.float32).reshape(-1)


# --- our own chunk over the flow model and HiFT -----------------------------------------------

_FLOW_CACHES = (
    "conformer_cnn_cache",
    "conformer_att_cache",
    "estimator_cnn_cache",
    "estimator_att_cache",
)


@dataclass(frozen=True)
class FlowState:
    """One voice stream between chunks: the speaker embedding, the prompt's
    length in mel frames, the flow's four caches and HiFT's three."""

    speaker: torch.Tensor
    prompt_frames: int
    flow: dict[str, torch.Tensor]
    mel: torch.Tensor
    source: torch.Tensor
    speech: torch.Tensor


class FlowRunner:
    """A chunk of any session's stream on the shared flow model and HiFT."""

    def __init__(self, token2wav: Any, graphs: bool | None = None) -> None:
        self.token2wav = token2wav
        self.flow = token2wav.flow
        self.hift = token2wav.hift
        self.lookahead = int(self.flow.pre_lookahead_len)
        self.device = next(self.hift.parameters()).device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        estimator = self.flow.decoder.estimator
        self._estimator_graphs = _EstimatorGraphs(estimator) if self.graphs else None

    def open(self, prompt_wav: str) -> FlowState:
        vocoder = self.token2wav
        with swapped(vocoder, {"cache": None, "stream_cache": None}):
            flow, hift = vocoder.set_stream_cache(prompt_wav)
            prompt = vocoder.cache
        speaker, prompt_mels = prompt[2], prompt[3]
        return FlowState(
            speaker=speaker.clone(),
            prompt_frames=int(prompt_mels.shape[1]),
            flow={name: flow[name].clone() for name in _FLOW_CACHES},
            mel=hift["mel"].clone(),
            source=hift["source"].clone(),
            speech=hift["speech"].clone(),
        )

    def chunk(self, state: FlowState, tokens: list[int], last: bool) -> tuple[np.ndarray, Any]:
        token = torch.tensor([tokens], dtype=torch.int32, device=self.device)
        with torch.inference_mode():
            mel, caches = self._flow_chunk(state, token, last)
            return self._hift_chunk(state, mel, caches, last)

    def _flow_chunk(
        self, state: FlowState, token: torch.Tensor, last: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The chunk's mel frames and the flow's next caches (the session's own)."""
        graphs = self._estimator_graphs
        with graphs.installed() if graphs is not None else contextlib.nullcontext():
            mel, caches = self.flow_step(
                token, state.speaker, state.flow, last, state.prompt_frames
            )
        return mel, {name: caches[name].clone() for name in _FLOW_CACHES}

    def flow_step(
        self,
        token: torch.Tensor,
        speaker: torch.Tensor,
        caches: dict[str, torch.Tensor],
        last: bool,
        prompt_frames: int,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The flow model's chunk, the caches cut back as ``stream()`` does:
        the prompt's frames and the last :data:`PROMPT_TAIL_FRAMES`."""
        precision = (
            torch.autocast(self.device.type, dtype=torch.float16, cache_enabled=False)
            if self.token2wav.float16
            else contextlib.nullcontext()
        )
        with precision:
            mel, after = self.flow.inference_chunk(
                token=token,
                spk=speaker,
                cache=dict(caches),
                last_chunk=last,
                n_timesteps=self.token2wav.n_timesteps,
            )
        after = dict(after)
        keep = prompt_frames + PROMPT_TAIL_FRAMES
        for name, dim in (("estimator_att_cache", 4), ("conformer_att_cache", 3)):
            cache = after[name]
            if cache.shape[dim] > keep:
                head = cache.narrow(dim, 0, prompt_frames)
                tail = cache.narrow(dim, cache.shape[dim] - PROMPT_TAIL_FRAMES, PROMPT_TAIL_FRAMES)
                after[name] = torch.cat([head, tail], dim)
        return mel, after

    def _hift_chunk(
        self, state: FlowState, chunk_mel: torch.Tensor, caches: dict[str, torch.Tensor], last: bool
    ) -> tuple[np.ndarray, FlowState]:
        """HiFT over the chunk after the cached mel frames, cross-faded into
        the previous chunk's held-back tail; all but a new tail (unless
        ``last``) is this chunk's audio."""
        vocoder = self.token2wav
        tail = int(vocoder.source_cache_len)
        mel = torch.cat([state.mel, chunk_mel], 2)
        speech, source = self.hift(mel, state.source)
        first = state.speech.shape[-1] == 0
        if not first:
            speech = _crossfade(speech, state.speech, vocoder.speech_window)
        after = FlowState(
            speaker=state.speaker,
            prompt_frames=state.prompt_frames,
            flow=caches,
            mel=mel[..., -int(vocoder.mel_cache_len) :].clone(),
            source=source[:, :, -tail:].clone(),
            speech=speech[:, -tail:].clone(),
        )
        if not last:
            speech = speech[:, :-tail]
            if first:  # the first chunk starts with silence in the tail's place
                speech = torch.nn.functional.pad(speech, (tail, 0))
        samples = speech.float().clamp(-1.0, 1.0).reshape(-1).cpu().numpy()
        return samples, after


def _crossfade(speech: torch.Tensor, previous: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """``speech`` with its head faded in over ``previous``'s tail (the two
    halves of ``window``)."""
    half = int(window.shape[0]) // 2
    faded = speech.clone()
    faded[..., :half] = speech[..., :half] * window[:half] + previous[..., -half:] * window[half:]
    return faded


# --- CUDA graphs of the flow estimator's blocks ----------------------------------------------


@dataclass
class _Arena:
    """Flat buffers the graphs' static inputs are views of, one per input:
    graphs of different shapes share them (one graph replays at a time)."""

    buffers: dict[int, torch.Tensor] = field(default_factory=dict)

    def view(self, index: int, like: torch.Tensor) -> torch.Tensor | None:
        """A view shaped like ``like``, or None when the buffer is too small
        (it is then regrown, and the graphs over the old one must go)."""
        buffer = self.buffers.get(index)
        if buffer is None or buffer.numel() < like.numel() or buffer.dtype != like.dtype:
            self.buffers[index] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
            return None
        return buffer[: like.numel()].view(like.shape)


@dataclass
class _BlocksGraph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    output: torch.Tensor


class _EstimatorGraphs:
    """The DiT estimator's blocks (what a chunk runs ten times, once per
    flow step: nearly all of its kernels) as CUDA graphs by shape, the part
    the vocoder package itself graphs; the rest of the chunk (the conformer,
    the time embedding, HiFT) stays eager: it copies from host memory, which
    a capture refuses. A shape's first call runs eagerly (its warm-up), its
    second is captured; at most :data:`MAX_GRAPHS` are kept, the least
    recently used dropped. If a capture fails, graphs are off from then on."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator
        self.blocks = type(estimator).blocks_forward_chunk  # the package's own method
        self.arena = _Arena()
        self.graphs: OrderedDict[tuple[Any, ...], _BlocksGraph] = OrderedDict()
        self.seen: set[tuple[Any, ...]] = set()
        self.failed = False

    @contextlib.contextmanager
    def installed(self) -> Any:
        """The estimator's blocks run through the graphs for the block."""
        if self.failed:
            yield
            return
        self.estimator.blocks_forward_chunk = self._run
        try:
            yield
        finally:
            del self.estimator.blocks_forward_chunk

    def _run(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        mask: Any,
        cnn_cache: torch.Tensor,
        att_cache: torch.Tensor,
        cnn_buffer: torch.Tensor,
        att_buffer: torch.Tensor,
    ) -> torch.Tensor:
        inputs = [x, t, cnn_cache, att_cache]
        key = tuple((tuple(value.shape), value.dtype) for value in inputs)
        graph = None
        if mask is None and not self.failed and key in self.seen:  # a shape's second call on
            graph = self.graphs.get(key) or self._capture(key, inputs, cnn_buffer, att_buffer)
        self.seen.add(key)
        if graph is None:  # eager: masked, a shape's first call, or graphs are off
            return self.blocks(self.estimator, x, t, mask, cnn_cache, att_cache, cnn_buffer,
                               att_buffer)  # fmt: skip
        self.graphs.move_to_end(key)
        for static, value in zip(graph.inputs, inputs, strict=True):
            static.copy_(value)
        graph.graph.replay()  # writes the new caches into the estimator's buffers
        return graph.output.clone()

    def _capture(
        self,
        key: tuple[Any, ...],
        inputs: list[torch.Tensor],
        cnn_buffer: torch.Tensor,
        att_buffer: torch.Tensor,
    ) -> _BlocksGraph | None:
        views = [self.arena.view(index, value) for index, value in enumerate(inputs)]
        if any(view is None for view in views):  # a buffer grew: old graphs read the old one
            self.graphs.clear()
            views = [self.arena.view(index, value) for index, value in enumerate(inputs)]
        static = [view for view in views if view is not None]
        for view, value in zip(static, inputs, strict=True):
            view.copy_(value)
        while len(self.graphs) >= MAX_GRAPHS:
            self.graphs.popitem(last=False)
        graph = torch.cuda.CUDAGraph()
        x, t, cnn_cache, att_cache = static
        try:
            # Warm-up on a stream of its own right before the capture, as
            # torch's notes ask; it writes what the replay writes again.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.blocks(self.estimator, x, t, None, cnn_cache, att_cache, cnn_buffer,
                            att_buffer)  # fmt: skip
            torch.cuda.current_stream().wait_stream(stream)
            # Each graph its own memory pool: a few MB of activations each.
            with CAPTURE_LOCK, torch.cuda.graph(graph, capture_error_mode="thread_local"):
                output = self.blocks(self.estimator, x, t, None, cnn_cache, att_cache,
                                     cnn_buffer, att_buffer)  # fmt: skip
        except Exception:
            log.exception("the vocoder's estimator did not capture as a CUDA graph; eager from now")
            self.failed = True
            self.graphs.clear()
            return None
        captured = _BlocksGraph(graph, static, output)
        self.graphs[key] = captured
        return captured
