"""CUDA graphs of the vocoder flow estimator's blocks: what a chunk runs once
per flow step (ten times a chunk) and nearly all of its thousands of small
kernels. The rest of a chunk (the conformer, the time embedding, HiFT) stays
eager: it copies from host memory, which a capture refuses.

A graph per input shape (the batch's rows, the chunk's frames, the caches'
length): a shape's first call runs eagerly (its warm-up), its second is
captured; at most :data:`MAX_GRAPHS` are kept, the least recently used
dropped. If a capture fails, graphs are off from then on.
"""

from __future__ import annotations

import logging
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

    def view(self, index: int, like: torch.Tensor) -> torch.Tensor | None:
        """A view shaped like ``like``, or None when the buffer is too small
        (it is then regrown, and the graphs over the old one must go)."""
        buffer = self.buffers.get(index)
        if buffer is None or buffer.numel() < like.numel() or buffer.dtype != like.dtype:
            self.buffers[index] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
            return None
        return buffer[: like.numel()].view(like.shape)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: tuple[torch.Tensor, ...]


class BlockGraphs:
    """``blocks(*inputs)`` (tensors in, a tuple of tensors out) through CUDA
    graphs by the inputs' shapes (see the module); called like ``blocks``,
    it returns the outputs as tensors of the caller's own."""

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks
        self.arena = _Arena()
        self.graphs: OrderedDict[tuple[Any, ...], _Graph] = OrderedDict()
        self.seen: set[tuple[Any, ...]] = set()
        self.failed = False
        self.captures = 0

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = tuple((tuple(value.shape), value.dtype) for value in inputs)
        graph = None
        if not self.failed and key in self.seen:  # a shape's second call on
            graph = self.graphs.get(key) or self._capture(key, list(inputs))
        self.seen.add(key)
        if graph is None:  # eager: a shape's first call, or graphs are off
            return self.blocks(*inputs)
        self.graphs.move_to_end(key)
        for static, value in zip(graph.inputs, inputs, strict=True):
            static.copy_(value)
        graph.graph.replay()
        return tuple(output.clone() for output in graph.outputs)

    def _capture(self, key: tuple[Any, ...], inputs: list[torch.Tensor]) -> _Graph | None:
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
        try:
            # Warm-up on a stream of its own right before the capture, as
            # torch's notes ask.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.blocks(*static)
            torch.cuda.current_stream().wait_stream(stream)
            # Each graph its own memory pool: its activations and outputs.
            with CAPTURE_LOCK, torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self.blocks(*static)
        except Exception:
            log.exception("the vocoder's estimator did not capture as a CUDA graph; eager from now")
            self.failed = True
            self.graphs.clear()
            return None
        self.captures += 1
        captured = _Graph(graph, static, tuple(outputs))
        self.graphs[key] = captured
        return captured
