"""CUDA graphs of the vocoder flow estimator's blocks: what a chunk runs once
per flow step (ten times a chunk) and nearly all of its thousands of small
kernels. The rest of a chunk (the conformer, the time embedding, HiFT) stays
eager: it copies from host memory, which a capture refuses.

A graph per input shape (the batch's rows, the chunk's frames, the caches'
length): a shape's first call runs eagerly (its warm-up), its second is
captured; at most :data:`MAX_GRAPHS` are kept, the least recently used
dropped. If a capture fails, graphs are off from then on.

A capture (an eager warm-up, then the capture) costs ~100 ms of the side
lane on an H100, several replays' time, so a graph, once made, is kept
until it is the least recently used of too many. The graphs' input buffers
are shared (:class:`_Arena`); a shape that needs more than a buffer holds
gets a new one, twice its size, and the graphs over the old one keep it
(each copies its inputs into its own views before a replay). Before, a new
buffer threw every graph away: a 12-session run on an H100 captured the
flow's blocks 19 times for the 6 shapes it kept, each capture holding the
vocoder's calls queued behind it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omnilive.engines.minicpmo.runtime.graphs import CAPTURE_LOCK

log = logging.getLogger(__name__)

MAX_GRAPHS = 24  # (batch, chunk) shapes kept: a voice needs about four per batch size

Blocks = Callable[..., tuple[torch.Tensor, ...]]


@dataclass
class _Arena:
    """Flat buffers the graphs' static inputs are views of, one per input:
    graphs of different shapes share them (one graph replays at a time)."""

    buffers: dict[int, torch.Tensor] = field(default_factory=dict)
    regrown: int = 0  # times a buffer was too small

    def view(
        self, index: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A view of that shape of buffer ``index``, which is replaced by one
        twice as large when too small (the views of the old one stay valid)."""
        numel = math.prod(shape)
        buffer = self.buffers.get(index)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype:
            self.regrown += buffer is not None
            buffer = self.buffers[index] = torch.empty(2 * numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: tuple[torch.Tensor, ...]


Shape = tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]


class BlockGraphs:
    """``blocks(*inputs)`` (tensors in, a tuple of tensors out) through CUDA
    graphs by the inputs' shapes (see the module); called like ``blocks``,
    it returns the outputs as tensors of the caller's own."""

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks
        self.arena = _Arena()
        self.graphs: OrderedDict[Shape, _Graph] = OrderedDict()
        self.seen: set[Shape] = set()
        self.failed = False
        self.pool: Any = None  # the graphs' memory pool, made at the first capture
        self.captures = 0  # graphs made, evicted ones included
        self.capture_s = 0.0
        self.evictions = 0
        self.eager = 0  # calls run eagerly while graphs are on

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = tuple((tuple(value.shape), value.dtype, value.device) for value in inputs)
        graph = None
        if not self.failed and key in self.seen:  # a shape's second call on
            graph = self.graphs.get(key) or self._capture(key)
        self.seen.add(key)
        if graph is None:  # eager: a shape's first call, or graphs are off
            self.eager += not self.failed
            return self.blocks(*inputs)
        self.graphs.move_to_end(key)
        for static, value in zip(graph.inputs, inputs, strict=True):
            static.copy_(value)
        graph.graph.replay()
        return tuple(output.clone() for output in graph.outputs)

    def stats(self) -> dict[str, float]:
        return {
            "graphs": len(self.graphs),
            "captures": self.captures,
            "capture_s": round(self.capture_s, 2),
            "evictions": self.evictions,
            "regrown": self.arena.regrown,
            "eager": self.eager,
        }

    def _capture(self, key: Shape) -> _Graph | None:
        """A graph of ``key``'s shapes over the arena's buffers. What they hold
        does not matter: the blocks branch on no value."""
        started = time.perf_counter()
        static = [self.arena.view(index, *shape).zero_() for index, shape in enumerate(key)]
        while len(self.graphs) >= MAX_GRAPHS:
            self.graphs.popitem(last=False)
            self.evictions += 1
        graph = torch.cuda.CUDAGraph()
        try:
            # Warm-up on a stream of its own right before the capture, as
            # torch's notes ask.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.blocks(*static)
            torch.cuda.current_stream().wait_stream(stream)
            # One memory pool for all of them: one graph replays at a time and
            # its outputs are copied out before the next, so what one leaves
            # is never another's to keep. A pool per graph holds its
            # activations for good: with 24 such graphs alive an H100 at 16
            # sessions peaked at 80.9 GB of its 81.5 (63.5 with the 17 here).
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with (
                CAPTURE_LOCK,
                torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"),
            ):
                outputs = self.blocks(*static)
        except Exception:
            log.exception("the vocoder's estimator did not capture as a CUDA graph; eager from now")
            self.failed = True
            self.graphs.clear()
            return None
        finally:
            self.capture_s += time.perf_counter() - started
        self.captures += 1
        captured = _Graph(graph, static, tuple(outputs))
        self.graphs[key] = captured
        return captured
