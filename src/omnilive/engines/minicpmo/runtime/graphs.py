"""CUDA graphs of
:meth:`BatchedSteps.run <omnilive.engines.minicpmo.runtime.batch.BatchedSteps.run>`,
one per (batch-size bucket, step-length bucket, width bucket), captured on
first use and replayed by every later step of that shape. A step whose
attention reads only each row's own columns at any width (a decoding step
through the fused decoder's kernel, :meth:`BatchedSteps.any_width`) has one
width, the buffers' own: its graphs, captured at start-up, serve every
context length, so a long call's growing contexts capture none of them.

A step with ``B`` requests of up to ``L`` new positions runs on the smallest
batch bucket ``>= B`` and step bucket ``>= L``: its plan is padded with empty
rows and padding positions (:meth:`BatchedSteps.plan`), copied into the
graph's static input tensors, and the graph is replayed; the real rows'
outputs are copied out before anything else can overwrite them. Steps longer
than the largest step bucket (long prefills: few, and their launch overhead
is small next to their work) or wider than the largest batch bucket run
eagerly.

A step whose slots all lie in a short prefix (the live sessions hold the
lowest slots, :meth:`SlotCache.acquire`) runs on the batch bucket that covers
slots ``0 ..`` its highest: each request on its slot's row, the buffers read
as one view (a *prefix* plan, no gather), the other rows empty. Released
slots leave holes that are not compacted: when the prefix up to the highest
requested slot is more than :data:`PREFIX_SPAN` times the requests, the step
gathers its rows instead, on the bucket of its request count. Steps longer
than :data:`SHORT_STEP` positions (prefills) take a prefix only when it has
no more rows than that bucket: an empty row computes all of the step's
positions, which costs a decoding step little and a prefill a whole row's work.

On the CPU there is nothing to capture: a *simulated* graph runs the same
static-input code path eagerly (copy in, ``run`` over the static tensors,
copy out), so CPU tests hold that bookkeeping to each session's own results.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch

from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, StepPlan, StepRequest, StepResult

STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

# Held by every CUDA graph capture of a model and by its side lane's calls: a
# capture puts the process's default CUDA generator into capture mode, and a
# random draw on it from another thread (HiFT's noise, the model code's
# sampling) fails then ("offset increment outside graph capture").
CAPTURE_LOCK = threading.RLock()
"""Step lengths with graphs: a decode step, short prefills (an audio unit's,
an omni unit's: a frame's 64 positions and a second of audio)."""

Key = tuple[int, int, int, bool]  # (batch bucket, step bucket, width, gather)

PREFIX_SPAN = 2
"""At most this many prefix rows per request, or a step gathers its rows: a
prefix row costs a row of the forward, a gathered one a copy of its K/V."""

SHORT_STEP = 8
"""Steps of at most this many positions are decoding steps (a unit's tokens),
longer ones prefills: only a decoding step takes a prefix with more rows than
its requests' bucket, and a batch loop runs the two kinds as separate steps."""


def batch_buckets(slots: int) -> tuple[int, ...]:
    """Powers of two below ``slots``, then ``slots``: 1, 2, 4, 8, 12 for 12."""
    buckets = [1]
    while buckets[-1] * 2 < slots:
        buckets.append(buckets[-1] * 2)
    return (*buckets, slots) if slots > buckets[-1] else tuple(buckets)


def bucket_for(needed: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding ``needed``, or ``None``: run eagerly."""
    return next((bucket for bucket in buckets if bucket >= needed), None)


class StepGraph:
    """One captured (or, off CUDA, simulated) ``steps.run`` over static inputs."""

    def __init__(
        self,
        steps: BatchedSteps,
        plan: StepPlan,
        embeds: torch.Tensor,
        *,
        capture: bool,
        pool: Any = None,
    ) -> None:
        self.steps = steps
        # Static inputs: this graph's own tensors, which every replay reads:
        # the rows' numbers (the plan's other tensors are derived from them in
        # the graph: each run below reads a fresh copy of the plan, whose
        # derived tensors are made by that run) and the embeddings.
        self.plan = replace(plan, packed=plan.packed.clone())
        self.embeds = embeds.clone()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        if not capture:
            return
        # Warm-up on a side stream before capture (lazy initialisations, cuBLAS
        # workspaces), as torch's CUDA graph notes ask. It and the capture write
        # the first plan's positions past each slot's length: never visible,
        # and the replay that follows writes them again.
        # (The model's device, whatever the calling thread's current one is.)
        # The warm-up holds CAPTURE_LOCK too: its stream comes from torch's
        # pool, handed out in turn, and may be the one another thread is
        # capturing on (torch.cuda.graph's shared default capture stream, the
        # vocoder's estimator on the side lane): a wait queued there fails
        # that capture and this step (cudaErrorStreamCaptureIsolation).
        with torch.cuda.device(steps.device), CAPTURE_LOCK:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                steps.run(self.embeds, replace(self.plan))
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: sessions' threads may use the GPU while the loop captures.
            with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
                self.hidden, self.logits = steps.run(self.embeds, replace(self.plan))

    def replay(self, plan: StepPlan, embeds: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Copy ``plan`` and ``embeds`` (same shapes, empty rows included: the
        whole static input is overwritten, nothing of a previous step stays)
        in, run, and copy the real rows' outputs out."""
        self.plan.packed.copy_(plan.packed)
        self.embeds.copy_(embeds)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.hidden, self.logits = self.steps.run(self.embeds, replace(self.plan))
        assert self.hidden is not None
        # Copies: the static outputs are the next replay's.
        if plan.prefix:
            index = list(plan.index)
            return self.hidden[index], None if self.logits is None else self.logits[index]
        real = len(plan.slots)
        hidden = self.hidden[:real].clone()
        return hidden, None if self.logits is None else self.logits[:real].clone()


class GraphCache:
    """Graphs of ``steps`` by (batch bucket, step bucket, width), at most
    ``max_graphs`` of them: the least recently replayed is dropped (its memory
    returns to the shared pool) when a new shape needs capturing.

    ``capture``: real CUDA graphs (default: when the model is on CUDA) or the
    simulated ones. All graphs share one memory pool: each keeps its static
    inputs and outputs referenced, so only intermediates, dead between
    replays, are shared, and the graphs may replay in any order."""

    def __init__(
        self,
        steps: BatchedSteps,
        *,
        batch_sizes: Sequence[int] | None = None,
        step_lengths: Sequence[int] = STEP_BUCKETS,
        # Every key of 8 slots (4 batch x 8 step buckets x 4 widths x read
        # or gathered): a session's context crosses a width every ~20 s of
        # omni, and an evicted graph is captured again (~150 ms for everyone).
        max_graphs: int = 256,
        capture: bool | None = None,
    ) -> None:
        if max_graphs < 1:
            raise ValueError("a graph cache keeps at least one graph")
        self.steps = steps
        self.batch_sizes = tuple(sorted(batch_sizes or batch_buckets(steps.cache.slots)))
        self.step_lengths = tuple(sorted(step_lengths))
        self.max_graphs = max_graphs
        self.capture = steps.device.type == "cuda" if capture is None else capture
        if self.capture and steps.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.graphs: OrderedDict[Key, StepGraph] = OrderedDict()
        self.captures = 0  # graphs made, evicted ones included
        self.capture_s = 0.0  # seconds spent making them (warm-up run and capture)
        self.eager = 0  # steps past the buckets
        self.gathers = 0  # graphed steps that read their rows through a gather

    def step(self, requests: Iterable[tuple[int, torch.Tensor]]) -> list[StepResult]:
        """:meth:`BatchedSteps.step`, through the graph of its buckets."""
        requests = [StepRequest(*request) for request in requests]
        if not requests:
            return []
        rows = bucket_for(len(requests), self.batch_sizes)
        length = bucket_for(max(int(r.inputs.shape[0]) for r in requests), self.step_lengths)
        if rows is None or length is None:
            self.eager += 1
            return self.steps.step(requests)
        steps = self.steps
        span = max(int(r.slot) for r in requests) + 1
        prefix = bucket_for(span, self.batch_sizes)
        width = steps.any_width(length)
        if prefix is not None and (
            prefix == rows or (length <= SHORT_STEP and span <= PREFIX_SPAN * len(requests))
        ):
            plan = steps.plan(requests, rows=prefix, length=length, prefix=True, width=width)
        else:
            plan = steps.plan(requests, rows=rows, length=length, gather=True, width=width)
            self.gathers += 1
        embeds = steps.embed(requests, rows=plan.batch, length=length, index=plan.index)
        key = (plan.batch, length, plan.width, plan.gather)
        graph = self._graph(key, plan, embeds)
        hidden, logits = graph.replay(plan, embeds)
        steps.cache.commit(plan)
        return [
            StepResult(slot, hidden[b], None if logits is None else logits[b])
            for b, slot in enumerate(plan.slots)
        ]

    def warm(self, lengths: Sequence[int] | None = None) -> int:
        """Capture now, not in the middle of sessions (a capture holds every
        session's next step for ~100 ms at full size), the graphs of every
        batch bucket for the steps of ``lengths`` positions (default: every
        step bucket), on the first width, read as a prefix and gathered,
        over slots taken for it and emptied after: call it while no session
        is live. Returns how many graphs it captured."""
        cache, before = self.steps.cache, self.captures
        lengths = self.step_lengths if lengths is None else lengths
        taken = [cache.acquire() for _ in range(max(self.batch_sizes))]
        try:
            for smaller, rows in zip((0, *self.batch_sizes), self.batch_sizes, strict=False):
                # The prefix of ``rows`` slots, and the fewest requests of this
                # bucket on the last slots: gathered (or, where a prefix serves
                # them, a graph just captured).
                for chosen in (taken[:rows], taken[len(taken) - smaller - 1 :]):
                    for length in lengths:
                        if bucket_for(length, self.step_lengths) is None:
                            continue
                        zeros = torch.zeros(length, dtype=torch.long, device=self.steps.device)
                        self.step([(slot, zeros) for slot in chosen])
                        for slot in chosen:
                            cache.crop(slot, 0)
        finally:
            for slot in taken:
                cache.release(slot)
        return self.captures - before

    def _graph(self, key: Key, plan: StepPlan, embeds: torch.Tensor) -> StepGraph:
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            return graph
        while len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)
        started = time.perf_counter()
        graph = StepGraph(self.steps, plan, embeds, capture=self.capture, pool=self.pool)
        self.graphs[key] = graph
        self.captures += 1
        self.capture_s += time.perf_counter() - started
        return graph
