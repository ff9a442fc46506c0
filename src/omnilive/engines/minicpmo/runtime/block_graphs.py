"""CUDA graphs of a model's eager blocks by input shape (:class:`BlockGraphs`):
the vocoder flow estimator's blocks (what a chunk runs once per flow step, ten
times a chunk, and nearly all of its thousands of small kernels), HiFT's two
parts, the vision encoder's layers. What a block calls around them stays
eager where it copies from host memory, which a capture refuses.

A graph per input shape (for the flow: the batch's rows, the chunk's frames,
the caches' length): a shape's first call runs eagerly (its warm-up), its
second is captured; at most :data:`MAX_GRAPHS` are kept, the least recently
used dropped. If a capture fails, graphs are off from then on.

A capture (an eager warm-up, then the capture) costs ~100 ms of the side
lane on an H100 for the flow, several replays' time, so a graph, once made,
is kept until it is the least recently used of too many. The graphs' input
buffers are shared (:class:`_Arena`); a shape that needs more than a buffer
holds gets a new one, twice its size, and the graphs over the old one keep it
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
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from omnilive.engines.minicpmo.runtime.graphs import CAPTURE_LOCK

log = logging.getLogger(__name__)

# Shapes kept a part. A voice's flow needs about five per batch size: the
# warm-up's default voice alone makes 23 (issue35o on an H200), and with 24
# kept a second voice's eight chats at once evicted and recaptured shapes
# in every round (first audio 757 ms p50 against 500 in the default voice).
# With one memory pool (see _graph) a kept graph holds only its outputs.
MAX_GRAPHS = 64

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
G = TypeVar("G")


class ShapeGraphs(Generic[G]):
    """The bookkeeping of graphs by input shape (see the module): a shape's
    first call eager, its second captured, the least recently used dropped
    past ``most``, graphs off for good after a failed capture; one memory
    pool for all (:meth:`memory_pool`) and the counts :meth:`stats` reports.
    Nothing here touches the GPU: the captures are the caller's."""

    def __init__(self, name: str, most: int = MAX_GRAPHS) -> None:
        self.name = name  # for the log
        self.most = most
        self.graphs: OrderedDict[Hashable, G] = OrderedDict()
        self.seen: set[Hashable] = set()
        self.failed = False
        self.pool: Any = None  # see memory_pool
        self.captures = 0  # graphs made, evicted ones included
        self.capture_s = 0.0
        self.evictions = 0
        self.eager = 0  # calls run eagerly while graphs are on

    def lookup(self, key: Hashable, capture: Callable[[], G]) -> G | None:
        """The graph of ``key``'s shape, made now by ``capture`` at the
        shape's second call; None where the call is to run eagerly."""
        graph = None
        if not self.failed and key in self.seen:
            graph = self.graphs.get(key) or self._capture(key, capture)
        self.seen.add(key)
        if graph is None:
            self.eager += not self.failed
            return None
        self.graphs.move_to_end(key)
        return graph

    def stats(self) -> dict[str, float]:
        return {
            "graphs": len(self.graphs),
            "captures": self.captures,
            "capture_s": round(self.capture_s, 2),
            "evictions": self.evictions,
            "eager": self.eager,
        }

    def memory_pool(self) -> Any:
        """The graphs' one CUDA memory pool, made at the first capture."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def _capture(self, key: Hashable, capture: Callable[[], G]) -> G | None:
        started = time.perf_counter()
        while len(self.graphs) >= self.most:
            self.graphs.popitem(last=False)
            self.evictions += 1
        try:
            graph = capture()
        except Exception:
            log.exception("%s did not capture as a CUDA graph; eager from now", self.name)
            self.failed = True
            self.graphs.clear()
            return None
        finally:
            self.capture_s += time.perf_counter() - started
        self.captures += 1
        self.graphs[key] = graph
        return graph


def warm_up(run: Callable[[], Any]) -> None:
    """``run()`` on a stream of its own, right before a capture of it, as
    torch's notes on CUDA graphs ask."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)


class BlockGraphs(ShapeGraphs[_Graph]):
    """``blocks(*inputs)`` (tensors in, a tuple of tensors out) through CUDA
    graphs by the inputs' shapes (see the module); called like ``blocks``,
    it returns the outputs as tensors of the caller's own."""

    def __init__(self, blocks: Blocks, name: str) -> None:
        super().__init__(name)
        self.blocks = blocks
        self.arena = _Arena()

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = tuple((tuple(value.shape), value.dtype, value.device) for value in inputs)
        graph = self.lookup(key, lambda: self._graph(key))
        if graph is None:  # eager: a shape's first call, or graphs are off
            return self.blocks(*inputs)
        for static, value in zip(graph.inputs, inputs, strict=True):
            static.copy_(value)
        graph.graph.replay()
        return tuple(output.clone() for output in graph.outputs)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "regrown": self.arena.regrown}

    def _graph(self, key: Shape) -> _Graph:
        """A graph of ``key``'s shapes over the arena's buffers. What they hold
        does not matter: the blocks branch on no value."""
        static = [self.arena.view(index, *shape).zero_() for index, shape in enumerate(key)]
        warm_up(lambda: self.blocks(*static))
        # One memory pool for all of them: one graph replays at a time and
        # its outputs are copied out before the next, so what one leaves
        # is never another's to keep. A pool per graph holds its
        # activations for good: with 24 such graphs alive an H100 at 16
        # sessions peaked at 80.9 GB of its 81.5 (63.5 with the 17 here).
        graph = torch.cuda.CUDAGraph()
        with (
            CAPTURE_LOCK,
            torch.cuda.graph(graph, pool=self.memory_pool(), capture_error_mode="thread_local"),
        ):
            outputs = self.blocks(*static)
        return _Graph(graph, static, tuple(outputs))
