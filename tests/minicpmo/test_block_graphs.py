"""The vocoder's block graphs (runtime/block_graphs.py) on CUDA: a shape's
second call captures it, a replay gives what the eager blocks give, and a
rising batch needs new input buffers a few times and loses no graph."""

from __future__ import annotations

import pytest
import torch

from omnilive.engines.minicpmo.runtime.block_graphs import BlockGraphs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def blocks(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.tanh(x @ w)
    return hidden, hidden.sum(-1)


def inputs(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, 64, device="cuda", generator=generator)
    return x, torch.randn(64, 32, device="cuda", generator=generator)


def same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_shapes_second_call_captures_and_replays_give_the_eager_result():
    graphs = BlockGraphs(blocks, "test blocks")
    for seed in range(4):
        assert same(graphs(*inputs(4, seed)), blocks(*inputs(4, seed)))
    stats = graphs.stats()
    assert stats["captures"] == 1 and stats["graphs"] == 1 and stats["eager"] == 1
    # The outputs are the caller's own: the next replay does not overwrite them.
    first = graphs(*inputs(4, 7))
    kept = [tensor.clone() for tensor in first]
    graphs(*inputs(4, 8))
    assert same(first, tuple(kept))


def test_a_rising_batch_gets_new_buffers_a_few_times_and_keeps_every_graph():
    graphs = BlockGraphs(blocks, "test blocks")
    sizes = [1, 2, 3, 4, 5, 6, 7, 8]
    for rows in sizes * 2:  # each size twice: captured at its second call
        assert same(graphs(*inputs(rows, rows)), blocks(*inputs(rows, rows)))
    stats = graphs.stats()
    # Exact sizes would need a new buffer at every larger batch (7 times);
    # twice the size, at 3 and at 5 rows. No graph is lost with the old one.
    assert stats["regrown"] == 2
    assert stats["graphs"] == stats["captures"] == len(sizes)
    for rows in sizes:  # all replays now
        assert same(graphs(*inputs(rows, 100 + rows)), blocks(*inputs(rows, 100 + rows)))
    assert graphs.stats()["captures"] == stats["captures"]
