"""The streaming Whisper encoder between its attentions as CUDA graphs.

A duplex unit's second of audio through Whisper is ~380 small kernels at one
session (24 layers of norms, projections and the feed-forward, plus each
row's attention over its own cache), launched one at a time by the encoders'
lane, whose thread shares the interpreter with the batch loop and the side
lane: ~10 ms of launching for ~4.5 ms of GPU work on an H200
(``benchmarks/results/gpu_encoders_nvidia_h200.json``). Each row's attention
reads a cache that grows every second, so it cannot be one graph of fixed
shapes; everything around it can. A :class:`_Chain` is, per shape (rows, mel
frames, context frames), one graph per stretch between two attentions:

    graph 0        convolutions, positions added, layer 0's projections
    attention 0    eager, each row over its cache, into the next graph's input
    graph 1        layer 0's rest (output projection, feed-forward),
                   layer 1's projections
    ...
    graph L        layer L-1's rest, the last norm, the projection, the pooling

so a unit at one session launches L + 1 replays and ~5 kernels an attention
instead of ~16 a layer. The stretches are the functions the eager path
(:func:`~omnilive.engines.minicpmo.sessions.encoders.whisper_batch.run_eagerly`) runs,
and a replay runs the kernels its capture recorded: the embeddings and caches
are the eager encoder's to the bit (``tests/minicpmo/test_whisper_batch.py``,
on CUDA). A graph's outputs are the next one's inputs in place (all in one
memory pool, kept alive by the chain), so nothing is copied between them but
the attentions' results.

As the vocoder's block graphs: a shape's first call runs eagerly, its second
captures the chain; at most :data:`MAX_CHAINS` are kept, the least recently
used dropped; a failed capture turns graphs off for good. Float16 models stay
eager (their layers clamp after a check of the values, a host read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnilive.engines.minicpmo.runtime.block_graphs import ShapeGraphs, warm_up
from omnilive.engines.minicpmo.runtime.graphs import CAPTURE_LOCK
from omnilive.engines.minicpmo.sessions.encoders.whisper_batch import (
    Attention,
    finished,
    front,
    projected,
    run_eagerly,
    tail,
)

MAX_CHAINS = 24  # (rows, frames, context) shapes kept: the 16 warm_encoders makes, and room


@dataclass
class _Chain:
    """One shape's graphs and the tensors they share: the inputs the eager
    parts write (features, positions, each attention's result) and the
    outputs they read (each layer's input, queries, keys and values; the
    embeddings)."""

    graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)
    features: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    projections: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    attended: list[torch.Tensor] = field(default_factory=list)
    embeds: torch.Tensor | None = None
    # Every stretch's outputs, held so that the pool never hands their memory
    # to a later stretch's work while a replay still has them to read.
    outputs: list[torch.Tensor] = field(default_factory=list)


class WhisperGraphs(ShapeGraphs[_Chain]):
    """Whisper through :class:`_Chain` graphs by shape (see the module);
    :meth:`run` is a drop-in for ``run_eagerly``."""

    def __init__(self, model: Any) -> None:
        super().__init__("the Whisper encoder", MAX_CHAINS)
        self.model = model

    def run(
        self,
        model: Any,
        features: torch.Tensor,
        positions: torch.Tensor,
        prefix: int,
        attend: Attention,
    ) -> torch.Tensor:
        chain = self.lookup(
            (tuple(features.shape), prefix), lambda: self._chain(prefix, features, positions)
        )
        if chain is None:  # eager: a shape's first call, or graphs are off
            return run_eagerly(model, features, positions, prefix, attend)
        return _replay(chain, features, positions, attend)

    def _chain(self, prefix: int, features: torch.Tensor, positions: torch.Tensor) -> _Chain:
        # The warm-up's attentions are over no cache (what they read does not matter).
        warm_up(lambda: _capture_chain(self.model, prefix, features, positions, None))
        with CAPTURE_LOCK:
            return _capture_chain(self.model, prefix, features, positions, self.memory_pool())


def _capture_chain(
    model: Any, prefix: int, features: torch.Tensor, positions: torch.Tensor, pool: Any
) -> _Chain:
    """The chain of ``features``' shape: with ``pool``, each stretch captured
    into it; without, each run once eagerly (the warm-up)."""
    apm = model.apm
    layers = apm.layers
    chain = _Chain(features=torch.zeros_like(features), positions=torch.zeros_like(positions))

    def stretch(fn: Any) -> Any:
        return fn() if pool is None else _captured(chain, fn, pool)

    def first() -> tuple[torch.Tensor, ...]:
        hidden = front(apm, chain.features, prefix, chain.positions)
        return (hidden, *projected(layers[0], hidden))

    hidden, *qkv = stretch(first)
    chain.projections.append(tuple(qkv))
    for index in range(1, len(layers) + 1):
        attended = torch.zeros_like(qkv[0])  # [rows, heads, width, head_dim]
        chain.attended.append(attended)

        def rest(
            hidden: torch.Tensor = hidden, attended: torch.Tensor = attended, index: int = index
        ) -> Any:
            done = finished(layers[index - 1], hidden, attended)
            if index == len(layers):
                return (tail(model, done),)
            return (done, *projected(layers[index], done))

        hidden, *qkv = stretch(rest)
        if index < len(layers):
            chain.projections.append(tuple(qkv))
    chain.embeds = hidden
    return chain


def _captured(chain: _Chain, fn: Any, pool: Any) -> tuple[torch.Tensor, ...]:
    """``fn()`` captured as the chain's next graph; its outputs, held by the chain."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = fn()
    chain.graphs.append(graph)
    chain.outputs += out
    return out


def _replay(
    chain: _Chain, features: torch.Tensor, positions: torch.Tensor, attend: Attention
) -> torch.Tensor:
    """The encoder through ``chain``: its inputs copied in, each stretch
    replayed, each attention written into the next stretch's input."""
    assert chain.features is not None and chain.positions is not None
    assert chain.embeds is not None
    chain.features.copy_(features)
    chain.positions.copy_(positions)
    for index, graph in enumerate(chain.graphs):
        graph.replay()
        if index < len(chain.projections):
            query, key, value = chain.projections[index]
            attend(index, query, key, value, out=chain.attended[index], keep=torch.clone)
    return chain.embeds.clone()
