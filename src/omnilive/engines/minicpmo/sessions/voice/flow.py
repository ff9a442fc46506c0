"""The vocoder's chunk written over minicpmo-utils' flow model and HiFT for a
batch of streams (:class:`FlowRunner`), tested equal to the package's own
``inference_chunk`` on the CPU (tests/minicpmo/test_flow_batch.py); the flow
estimator's blocks replayed from CUDA graphs per batch bucket."""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from omnilive.engines.minicpmo.runtime.block_graphs import BlockGraphs
from omnilive.engines.minicpmo.runtime.tensors import swapped
from omnilive.engines.minicpmo.sessions.voice.hift import Hift

log = logging.getLogger(__name__)

PROMPT_TAIL_FRAMES = 100  # the flow's caches keep the prompt plus this many frames
# Flow batches are padded up to these sizes (repeating a row), so a handful
# of CUDA graphs serves any number of sessions.
BATCH_BUCKETS = (1, 2, 4, 8)
MAX_BATCH = BATCH_BUCKETS[-1]  # chunks in one flow batch; more wait for the next

# One chunk of one stream: its state, its tokens, whether it is the turn's last.
ChunkCall = tuple[Any, list[int], bool]


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

    def shape(self) -> tuple[Any, ...]:
        """What chunks must share to run as one batch."""
        tensors = (self.speaker, *self.flow.values(), self.mel, self.source, self.speech)
        return (self.prompt_frames, *(tuple(tensor.shape) for tensor in tensors))


class FlowRunner:
    """Chunks of any sessions' streams on the shared flow model and HiFT.

    Chunks whose streams have the same shapes (the same voice prompt's
    length, as far into their turns, the same number of tokens) run as one
    batch: the flow's classifier-free guidance already runs each stream as
    two rows (with and without its conditions), a batch of ``B`` streams
    runs ``2B`` rows, the conditioned ones first, and HiFT runs ``B``. The
    flow's steps are written here over the package's modules (its own loop
    keeps its caches in scratch buffers of two rows); the estimator's blocks,
    nearly all of a chunk's kernels, are CUDA graphs per batch and cache
    shape on CUDA (:class:`~omnilive.engines.minicpmo.runtime.block_graphs.BlockGraphs`),
    and so are HiFT's launch-bound parts
    (:class:`~omnilive.engines.minicpmo.sessions.voice.hift.Hift`)."""

    def __init__(self, token2wav: Any, graphs: bool | None = None) -> None:
        self.token2wav = token2wav
        self.flow = token2wav.flow
        self.hift = token2wav.hift
        self.estimator = self.flow.decoder.estimator
        keep_frequencies(self.estimator.t_embedder)
        self.lookahead = int(self.flow.pre_lookahead_len)
        self.steps = int(token2wav.n_timesteps)
        self.device = next(self.hift.parameters()).device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        blocks = partial(estimator_blocks, self.estimator)
        self._blocks = BlockGraphs(blocks, "the flow estimator") if self.graphs else blocks
        self._hift = Hift(self.hift, graphs=self.graphs)
        self.batch_sizes: Counter[int] = Counter()  # streams per flow batch (bounded keys)

    @property
    def block_graphs(self) -> dict[str, BlockGraphs]:
        """Its graphed parts by name (none without graphs)."""
        flow = {"flow": self._blocks} if isinstance(self._blocks, BlockGraphs) else {}
        return {**flow, **self._hift.graphs}

    def graph_stats(self) -> dict[str, dict[str, float]]:
        return {name: graphs.stats() for name, graphs in self.block_graphs.items()}

    def open(self, prompt_wav: str) -> FlowState:
        vocoder = self.token2wav
        with swapped(vocoder, {"cache": None, "stream_cache": None}):
            flow, hift = vocoder.set_stream_cache(prompt_wav)
            prompt = vocoder.cache
        speaker, prompt_mels = prompt[2], prompt[3]
        caches = {name: flow[name] for name in _FLOW_CACHES}
        blocks = len(self.estimator.blocks)
        for name in ("estimator_cnn_cache", "estimator_att_cache"):
            # The package's scratch buffers hold 16 flow steps of 16 blocks;
            # a chunk reads its steps' and blocks' (and makes as many).
            caches[name] = caches[name][: self.steps, :blocks]
        return FlowState(
            speaker=speaker.clone(),
            prompt_frames=int(prompt_mels.shape[1]),
            flow={name: cache.clone() for name, cache in caches.items()},
            mel=hift["mel"].clone(),
            source=hift["source"].clone(),
            speech=hift["speech"].clone(),
        )

    def chunk(self, state: FlowState, tokens: list[int], last: bool) -> tuple[np.ndarray, Any]:
        return self.chunks([(state, tokens, last)])[0]

    def chunks(self, calls: list[ChunkCall]) -> list[tuple[np.ndarray, Any]]:
        made: list[tuple[np.ndarray, Any] | None] = [None] * len(calls)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, (state, tokens, last) in enumerate(calls):
            groups.setdefault((state.shape(), len(tokens), last), []).append(index)
        with torch.inference_mode():
            for indices in groups.values():
                for start in range(0, len(indices), MAX_BATCH):
                    part = indices[start : start + MAX_BATCH]
                    states = [calls[index][0] for index in part]
                    token = torch.tensor([calls[index][1] for index in part], dtype=torch.int32)
                    last = calls[part[0]][2]
                    mel, caches = self.flow_batch(states, token.to(self.device), last)
                    self.batch_sizes[len(part)] += 1
                    for index, result in zip(
                        part, self._hift_batch(states, mel, caches, last), strict=True
                    ):
                        made[index] = result
        return [result for result in made if result is not None]

    # --- the flow model -----------------------------------------------------------------

    def flow_batch(
        self, states: list[FlowState], token: torch.Tensor, last: bool
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """The chunk's mel frames ``[B, mels, frames]`` of streams of one shape
        (``token`` ``[B, tokens]``), and each stream's next flow caches (its
        own tensors), cut back as ``stream()`` does: the prompt's frames and
        the last :data:`PROMPT_TAIL_FRAMES`."""
        rows = len(states)
        padded = states + [states[-1]] * (_bucket(rows) - rows)
        token = torch.cat([token, token[-1:].expand(len(padded) - rows, -1)])
        flow = self.flow
        conformer_cnn = torch.cat([s.flow["conformer_cnn_cache"] for s in padded], 0)
        conformer_att = torch.cat([s.flow["conformer_att_cache"] for s in padded], 1)
        estimator_cnn = _guided_rows([s.flow["estimator_cnn_cache"] for s in padded])
        estimator_att = _guided_rows([s.flow["estimator_att_cache"] for s in padded])
        speaker = torch.cat([s.speaker for s in padded], 0)
        precision = (
            torch.autocast(self.device.type, dtype=torch.float16, cache_enabled=False)
            if self.token2wav.float16
            else contextlib.nullcontext()
        )
        with precision:
            speaker = flow.spk_embed_affine_layer(torch.nn.functional.normalize(speaker, dim=1))
            hidden, conformer_cnn, conformer_att = flow.encoder.forward_chunk(
                xs=flow.input_embedding(token),
                last_chunk=last,
                cnn_cache=conformer_cnn,
                att_cache=conformer_att,
            )
            mu = flow.encoder_proj(hidden).transpose(1, 2).contiguous()
            mel, estimator_cnn, estimator_att = self._solve(
                mu, speaker, estimator_cnn, estimator_att
            )
        keep = states[0].prompt_frames + PROMPT_TAIL_FRAMES
        if estimator_att.shape[4] > keep:
            estimator_att = _cut_back(estimator_att, 4, states[0].prompt_frames)
        if conformer_att.shape[3] > keep:
            conformer_att = _cut_back(conformer_att, 3, states[0].prompt_frames)
        width = len(padded)
        caches = [
            {
                "conformer_cnn_cache": conformer_cnn[row : row + 1].clone(),
                "conformer_att_cache": conformer_att[:, row : row + 1].clone(),
                "estimator_cnn_cache": _own_rows(estimator_cnn, row, width),
                "estimator_att_cache": _own_rows(estimator_att, row, width),
            }
            for row in range(rows)
        ]
        return mel[:rows], caches

    def _solve(
        self, mu: torch.Tensor, speaker: torch.Tensor, cnn: torch.Tensor, att: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The flow matching's Euler steps from the decoder's fixed noise, each
        step's estimate guided (conditioned rows against unconditioned):
        the mel frames and every step's new estimator caches."""
        decoder = self.flow.decoder
        rows, _, frames = mu.shape
        offset = int(att.shape[4])
        x = decoder.rand_noise[:, :, offset : offset + frames].expand(rows, -1, -1)
        times = torch.linspace(0, 1, self.steps + 1, device=mu.device, dtype=mu.dtype)
        times = 1 - torch.cos(times * 0.5 * torch.pi)
        t, dt = times[:1], times[1] - times[0]
        mu_in = torch.cat([mu, torch.zeros_like(mu)], 0)
        speaker_in = torch.cat([speaker, torch.zeros_like(speaker)], 0)
        cond_in = torch.zeros_like(mu_in)
        rate = decoder.inference_cfg_rate
        new_cnn, new_att = [], []
        for step in range(self.steps):
            embedded = self.estimator.t_embedder(t.repeat(2 * rows)).unsqueeze(1)
            speakers = speaker_in[:, :, None].expand(-1, -1, frames)
            inputs = torch.cat([x.repeat(2, 1, 1), mu_in, speakers, cond_in], 1)
            estimate, step_cnn, step_att = self._blocks(inputs, embedded, cnn[step], att[step])
            guided, unguided = estimate.chunk(2, 0)
            x = x + dt * ((1.0 + rate) * guided - rate * unguided)
            t = t + dt
            if step + 1 < self.steps:
                dt = times[step + 2] - t
            new_cnn.append(step_cnn)
            new_att.append(step_att)
        return x, torch.stack(new_cnn), torch.stack(new_att)

    # --- HiFT ---------------------------------------------------------------------------

    def _hift_batch(
        self,
        states: list[FlowState],
        chunk_mel: torch.Tensor,
        caches: list[dict[str, torch.Tensor]],
        last: bool,
    ) -> list[tuple[np.ndarray, FlowState]]:
        """HiFT over each chunk after its stream's cached mel frames,
        cross-faded into the previous chunk's held-back tail; all but a new
        tail (unless ``last``) is the chunk's audio."""
        vocoder = self.token2wav
        tail = int(vocoder.source_cache_len)
        mel = torch.cat([torch.cat([state.mel for state in states]), chunk_mel], 2)
        speech, source = self._hift(mel, torch.cat([state.source for state in states]))
        first = states[0].speech.shape[-1] == 0
        if not first:
            previous = torch.cat([state.speech for state in states])
            speech = _crossfade(speech, previous, vocoder.speech_window)
        kept = int(vocoder.mel_cache_len)
        afters = [
            FlowState(
                speaker=state.speaker,
                prompt_frames=state.prompt_frames,
                flow=caches[row],
                mel=mel[row : row + 1, :, -kept:].clone(),
                source=source[row : row + 1, :, -tail:].clone(),
                speech=speech[row : row + 1, -tail:].clone(),
            )
            for row, state in enumerate(states)
        ]
        if not last:
            speech = speech[:, :-tail]
            if first:  # the first chunk starts with silence in the tail's place
                speech = torch.nn.functional.pad(speech, (tail, 0))
        samples = speech.float().clamp(-1.0, 1.0).cpu().numpy()
        return [(samples[row], after) for row, after in enumerate(afters)]


def _bucket(rows: int) -> int:
    return next((size for size in BATCH_BUCKETS if size >= rows), rows)


def _guided_rows(caches: list[torch.Tensor]) -> torch.Tensor:
    """Streams' estimator caches ``[steps, blocks, 2, ...]`` (each stream's
    conditioned row, then its unconditioned one) as one ``[steps, blocks,
    2B, ...]``: every conditioned row, then every unconditioned one, the
    order the guided batch runs in."""
    return torch.cat(
        [cache[:, :, :1] for cache in caches] + [cache[:, :, 1:] for cache in caches], 2
    )


def _own_rows(cache: torch.Tensor, row: int, width: int) -> torch.Tensor:
    """Stream ``row``'s two rows of a guided batch's cache, as its own tensor."""
    return torch.cat([cache[:, :, row : row + 1], cache[:, :, width + row : width + row + 1]], 2)


def _cut_back(cache: torch.Tensor, dim: int, prompt_frames: int) -> torch.Tensor:
    """The prompt's frames and the last :data:`PROMPT_TAIL_FRAMES` along ``dim``."""
    head = cache.narrow(dim, 0, prompt_frames)
    tail = cache.narrow(dim, cache.shape[dim] - PROMPT_TAIL_FRAMES, PROMPT_TAIL_FRAMES)
    return torch.cat([head, tail], dim)


def _crossfade(speech: torch.Tensor, previous: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """``speech`` with its head faded in over ``previous``'s tail (the two
    halves of ``window``)."""
    half = int(window.shape[0]) // 2
    faded = speech.clone()
    faded[..., :half] = speech[..., :half] * window[:half] + previous[..., -half:] * window[half:]
    return faded


def estimator_blocks(
    estimator: Any, x: torch.Tensor, t: torch.Tensor, cnn: torch.Tensor, att: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flow estimator's blocks over ``x`` ``[rows, channels, frames]``
    from the blocks' caches ``cnn``/``att`` (stacked): its output and each
    block's new caches (stacked), none written in place (what a graph of
    :class:`BlockGraphs` replays)."""
    x = estimator.in_proj(x.transpose(1, 2))
    new_cnn, new_att = [], []
    for index, block in enumerate(estimator.blocks):
        x, block_cnn, block_att = block.forward_chunk(x, t, cnn[index], att[index], None)
        new_cnn.append(block_cnn)
        new_att.append(block_att)
    x = estimator.final_layer(x, t).transpose(1, 2)
    return x, torch.stack(new_cnn), torch.stack(new_att)


def keep_frequencies(embedder: Any) -> None:
    """Give the flow estimator's timestep embedder its sinusoid's frequencies
    once per device and dtype. The package's ``timestep_embedding`` makes them
    on the CPU and copies them over at every flow step: a copy from pageable
    memory waits for everything queued on the stream, so the vocoder's thread
    could never launch a step ahead of the GPU (ten waits a chunk, a fifth of
    the side lane's time at 12 sessions on an H100). The same arithmetic as
    the package's, on the same frequencies: the same embeddings."""
    if getattr(embedder.timestep_embedding, "kept", False):
        return
    frequencies: dict[tuple[Any, ...], torch.Tensor] = {}

    def timestep_embedding(t: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
        key = (t.device, t.dtype, dim, max_period)
        if (freqs := frequencies.get(key)) is None:
            half = dim // 2
            freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half) / half)
            freqs = frequencies[key] = freqs.to(t)
        args = t[:, None] * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding

    timestep_embedding.kept = True  # type: ignore[attr-defined]  # a marker attribute on the function object
    embedder.timestep_embedding = timestep_embedding


def graph_model_code_flow(token2wav: Any, graphs: bool | None = None) -> bool:
    """Route the vocoder's own ``stream()`` (what the model code voices chat
    and half-duplex answers with, and duplex sessions with ``slots = 1``)
    through :func:`estimator_blocks`, on CUDA as graphs of
    :class:`BlockGraphs` (a graph per shape: a voice's chunks repeat their
    shapes request after request). The package's method writes the blocks'
    new caches into the estimator's scratch buffers; so does the
    replacement. Returns whether it was installed (a flow without
    ``blocks_forward_chunk`` keeps its own code)."""
    decoder = getattr(getattr(token2wav, "flow", None), "decoder", None)
    estimator = getattr(decoder, "estimator", None)
    original = getattr(estimator, "blocks_forward_chunk", None)
    if original is None or getattr(original, "graphed", False):
        return False
    device = next(estimator.parameters()).device
    eager = partial(estimator_blocks, estimator)
    on = device.type == "cuda" if graphs is None else graphs
    run = BlockGraphs(eager, "the model code's flow estimator") if on else eager
    blocks = len(estimator.blocks)

    def blocks_forward_chunk(
        x: Any,
        t: Any,
        mask: Any,
        cnn_cache: Any = None,
        att_cache: Any = None,
        cnn_cache_buffer: Any = None,
        att_cache_buffer: Any = None,
    ) -> torch.Tensor:
        caches = (cnn_cache, att_cache, cnn_cache_buffer, att_cache_buffer)
        if mask is not None or not all(isinstance(cache, torch.Tensor) for cache in caches):
            return original(x, t, mask, cnn_cache, att_cache, cnn_cache_buffer, att_cache_buffer)
        out, new_cnn, new_att = run(x, t, cnn_cache, att_cache)
        cnn_cache_buffer[:blocks] = new_cnn
        att_cache_buffer[:blocks, :, :, : new_att.shape[3]] = new_att
        return out

    blocks_forward_chunk.graphed = True  # type: ignore[attr-defined]  # a marker attribute on the function object
    estimator.blocks_forward_chunk = blocks_forward_chunk
    return True
