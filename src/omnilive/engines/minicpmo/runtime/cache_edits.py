"""Edits of one slot's context in a :class:`~omnilive.engines.minicpmo.runtime.batch.SlotCache`
that a sliding window makes: positions dropped from the middle, and positions
lifted out and put back further along, their keys re-rotated to where they
now stand.

Keys are cached with their rotary embedding applied, at their position. When
positions before them go, the ones that stay move to lower positions and
their keys are turned back by the old angles and forward by the new ones
(values carry no position). The arithmetic is the model code's
(``realign_rotary_suffix`` in MiniCPM-o's ``utils.py``), in the cache's own
dtype and in the same order of operations, so that a window slid here leaves
the same bits as the model code's own: the equality harness holds the two to
the same decisions across evictions.

These run on the batch loop's thread between batches (a program's own slot,
which it owns then); nothing here is CUDA specific.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from omnilive.engines.minicpmo.runtime.batch import SlotCache


def rotary_angles(
    head_dim: int, positions: torch.Tensor, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[n, head_dim]`` of ``positions`` (the halves repeated, as
    the rotary embedding lays them out), computed in float32, then in ``dtype``."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inverse = 1.0 / (theta**exponent)
    angles = torch.einsum("i,j->ij", positions.to(torch.float32), inverse)
    cos, sin = torch.cos(angles), torch.sin(angles)
    return torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class Rotation:
    """What turns keys cached at positions ``old_start …`` into keys cached at
    ``new_start …``: the angles of both, computed once for every layer of a
    slot (the layers share their head size, dtype and device)."""

    cos_old: torch.Tensor
    sin_old: torch.Tensor
    cos_new: torch.Tensor
    sin_new: torch.Tensor

    @classmethod
    def of(cls, keys: torch.Tensor, old_start: int, new_start: int, theta: float) -> Rotation:
        n, head_dim = keys.shape[-2], keys.shape[-1]
        steps = torch.arange(n, device=keys.device, dtype=torch.long)
        cos_old, sin_old = rotary_angles(head_dim, steps + old_start, theta, keys.dtype)
        cos_new, sin_new = rotary_angles(head_dim, steps + new_start, theta, keys.dtype)
        return cls(cos_old, sin_old, cos_new, sin_new)

    def apply(self, keys: torch.Tensor) -> torch.Tensor:
        base = self.cos_old * keys - self.sin_old * _rotate_half(keys)
        return self.cos_new * base + self.sin_new * _rotate_half(base)


def realigned(keys: torch.Tensor, old_start: int, new_start: int, theta: float) -> torch.Tensor:
    """``keys`` ``[..., n, head_dim]`` cached at positions ``old_start …``,
    as cached at ``new_start …``."""
    return _realigner(keys, old_start, new_start, theta)(keys)


def _realigner(
    sample: torch.Tensor, old_start: int, new_start: int, theta: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`realigned` for every layer's keys shaped like ``sample``, the
    angles computed once (a drop runs between two batches of every session:
    36 layers' trigonometry would be 36 times the work for the same bits)."""
    if sample.shape[-2] == 0 or old_start == new_start:
        return lambda keys: keys
    return Rotation.of(sample, old_start, new_start, theta).apply


# Layers whose moved keys are stacked and turned together: one launch of each
# of the rotation's elementwise kernels per group instead of per layer (a
# window's edit runs on the batch loop's thread between every session's
# steps), the group's copy a few hundred MB at most at full size.
LAYER_GROUP = 12


def _groups(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    return [tensors[i : i + LAYER_GROUP] for i in range(0, len(tensors), LAYER_GROUP)]


def drop_positions(
    cache: SlotCache, slot: int, start: int, lengths: int | Sequence[int], theta: float
) -> None:
    """Remove ``lengths`` positions at ``start`` of ``slot``, or several runs
    of them one after another (a basic window's units, each at ``start``
    once the one before it is gone); the positions after them move down,
    their keys re-rotated.

    Several runs leave the same bits as one drop per run: each key that
    stays is turned once per run, from where it stood to where that run's
    drop puts it, as the model code drops its units one at a time; but the
    keys of the units dropped later are never turned, and what stays is
    read and written once, every layer of a group at a time."""
    runs = [n for n in ([lengths] if isinstance(lengths, int) else lengths) if n > 0]
    end, total = cache.lengths[slot], sum(runs)
    if not runs:
        return
    if not 0 <= start <= start + total <= end:
        raise ValueError(f"slot {slot} holds {end} positions: cannot drop {start}+{total}")
    moved = end - start - total
    if moved:
        kept = slice(start + total, end)
        sample = cache.key_cache[0][slot, :, kept]
        turns, after = [], total
        for n in runs:  # run j: what stays stands at start + n + the runs after it
            after -= n
            turns.append(_realigner(sample, start + n + after, start + after, theta))
        for keys in _groups(cache.key_cache):
            stacked = torch.stack([k[slot, :, kept] for k in keys])
            for turn in turns:
                stacked = turn(stacked)
            for k, turned in zip(keys, stacked, strict=True):
                k[slot, :, start : start + moved] = turned
        for values in _groups(cache.value_cache):
            stacked = torch.stack([v[slot, :, kept] for v in values])
            for v, shifted in zip(values, stacked, strict=True):
                v[slot, :, start : start + moved] = shifted
    cache.crop(slot, end - total)


@dataclass
class Lifted:
    """Positions lifted out of a slot (every layer's keys and values), and
    where they stood."""

    start: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[-2]) if self.keys else 0


def lift_positions(cache: SlotCache, slot: int, start: int) -> Lifted:
    """Copies of ``slot``'s positions from ``start`` to its end; the slot is
    cropped to ``start``."""
    end = cache.lengths[slot]

    def copies(buffers: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            copy
            for group in _groups(buffers)
            for copy in torch.stack([b[slot, :, start:end] for b in group]).unbind(0)
        ]

    keys, values = copies(cache.key_cache), copies(cache.value_cache)
    cache.crop(slot, start)
    return Lifted(start, keys, values)


def put_back(cache: SlotCache, slot: int, lifted: Lifted, theta: float) -> None:
    """``lifted`` appended at ``slot``'s end, its keys re-rotated to stand there."""
    at, n = cache.lengths[slot], lifted.length
    if at + n > cache.capacity:
        raise ValueError(f"slot {slot}: {n} positions after {at} pass its capacity")
    if n:
        turn = _realigner(lifted.keys[0], lifted.start, at, theta)
        for first in range(0, len(cache.key_cache), LAYER_GROUP):
            group = slice(first, first + LAYER_GROUP)
            turned = turn(torch.stack(lifted.keys[group]))
            for keys, moved in zip(cache.key_cache[group], turned, strict=True):
                keys[slot, :, at : at + n] = moved
        for values, lifted_values in zip(cache.value_cache, lifted.values, strict=True):
            values[slot, :, at : at + n] = lifted_values
    cache.lengths[slot] = at + n
