"""Where one batched step reads and writes (:class:`StepPlan`): the host's
numbers of each row, and the device tensors the forward reads, derived from
them on the device.

The rows' numbers (empty or not, the slot's length, the new positions, the
slot) cross to the device as one small tensor, :attr:`StepPlan.packed`; the
positions, write columns, mask and the rest are derived from it when the
forward first reads them. A CUDA graph of the step
(:mod:`~omnilive.engines.minicpmo.runtime.graphs`) captures that derivation
with the forward, so a replay copies in one ``[4, rows]`` tensor instead of
six derived ones and launches none of the two dozen small kernels that make
them: each of those cost the batch loop's thread a call and the step a wait
for the GPU's multiprocessors behind the lanes' work.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch

# The rows of :attr:`StepPlan.packed`.
EMPTY, HELD, COUNT, SLOT = range(4)


class PlanTensors(NamedTuple):
    rows: torch.Tensor  # [B] slot of each row
    positions: torch.Tensor  # [B, L] RoPE position ids
    write: torch.Tensor  # [B, L] buffer column of each new position
    mask: torch.Tensor  # [B, 1, L, width] additive: 0 visible, dtype min hidden
    limit: torch.Tensor  # [B, L] the last column each new position sees (the mask's edge)
    last: torch.Tensor  # [B] index of each row's last real position


@dataclass(frozen=True)
class StepPlan:
    """Where one batched step reads and writes: host values for checks and
    bookkeeping, the rows' numbers on the device (the input of a CUDA graph)
    and the tensors the forward reads, derived from them (see the module)."""

    slots: tuple[int, ...]
    counts: tuple[int, ...]
    width: int  # buffer columns the step's attention reads (a width bucket or wider)
    length: int  # new positions of every row (the longest request's, or a bucket's)
    packed: torch.Tensor  # [4, B] per row: empty (no slot's positions), held, count, slot
    scratch: int  # the buffer column padding positions write to
    dtype: torch.dtype  # the mask's
    # Read the rows' buffers through an index_select of ``rows`` even when the
    # slots are neighbours: a CUDA graph replays one read for any slots.
    gather: bool = False
    # Row b reads slot b's buffers (the view of slots 0 .. B-1): what a CUDA
    # graph of any requests within that prefix replays without a gather.
    prefix: bool = False
    # The row of each request (in request order): its slot in a prefix plan.
    index: tuple[int, ...] = ()

    @property
    def batch(self) -> int:
        """Rows of the step, empty ones included."""
        return int(self.packed.shape[1])

    @cached_property
    def tensors(self) -> PlanTensors:
        """The forward's tensors, derived on the device from :attr:`packed`
        at the first read (within a graph's capture: in the graph)."""
        packed, device = self.packed, self.packed.device
        empty, lengths, real = packed[EMPTY].bool(), packed[HELD][:, None], packed[COUNT][:, None]
        offsets = torch.arange(self.length, device=device)[None, :]
        positions = lengths + offsets
        write = torch.where((offsets < real) & ~empty[:, None], positions, self.scratch)
        # A padding query sees what the row's last real one sees: never a
        # fully masked row (fused SDPA kernels mishandle those), never padding.
        limit = lengths + torch.minimum(offsets, real - 1)
        visible = torch.arange(self.width, device=device)[None, None, :] <= limit[:, :, None]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=device)
        mask = mask.masked_fill(~visible, torch.finfo(self.dtype).min)[:, None]
        return PlanTensors(packed[SLOT], positions, write, mask, limit, real[:, 0] - 1)

    @property
    def rows(self) -> torch.Tensor:
        return self.tensors.rows

    @property
    def positions(self) -> torch.Tensor:
        return self.tensors.positions

    @property
    def write(self) -> torch.Tensor:
        return self.tensors.write

    @property
    def mask(self) -> torch.Tensor:
        return self.tensors.mask

    @property
    def limit(self) -> torch.Tensor:
        return self.tensors.limit

    @property
    def last(self) -> torch.Tensor:
        return self.tensors.last
