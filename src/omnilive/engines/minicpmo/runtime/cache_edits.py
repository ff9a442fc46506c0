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

from collections.abc import Callable
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


def drop_positions(cache: SlotCache, slot: int, start: int, length: int, theta: float) -> None:
    """Remove positions ``start .. start + length - 1`` of ``slot``; the ones
    after them move down by ``length``, their keys re-rotated."""
    end = cache.lengths[slot]
    if length <= 0:
        return
    if not 0 <= start <= start + length <= end:
        raise ValueError(f"slot {slot} holds {end} positions: cannot drop {start}+{length}")
    moved = end - start - length
    turn: Callable[[torch.Tensor], torch.Tensor] | None = None
    for keys, values in zip(cache.key_cache, cache.value_cache, strict=True):
        kept_keys = keys[slot, :, start + length : end].clone()
        kept_values = values[slot, :, start + length : end].clone()
        turn = turn or _realigner(kept_keys, start + length, start, theta)
        keys[slot, :, start : start + moved] = turn(kept_keys)
        values[slot, :, start : start + moved] = kept_values
    cache.crop(slot, end - length)


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
    keys = [k[slot, :, start:end].clone() for k in cache.key_cache]
    values = [v[slot, :, start:end].clone() for v in cache.value_cache]
    cache.crop(slot, start)
    return Lifted(start, keys, values)


def put_back(cache: SlotCache, slot: int, lifted: Lifted, theta: float) -> None:
    """``lifted`` appended at ``slot``'s end, its keys re-rotated to stand there."""
    at, n = cache.lengths[slot], lifted.length
    if at + n > cache.capacity:
        raise ValueError(f"slot {slot}: {n} positions after {at} pass its capacity")
    turn: Callable[[torch.Tensor], torch.Tensor] | None = None
    for keys, values, lifted_keys, lifted_values in zip(
        cache.key_cache, cache.value_cache, lifted.keys, lifted.values, strict=True
    ):
        turn = turn or _realigner(lifted_keys, lifted.start, at, theta)
        keys[slot, :, at : at + n] = turn(lifted_keys)
        values[slot, :, at : at + n] = lifted_values
    cache.lengths[slot] = at + n
