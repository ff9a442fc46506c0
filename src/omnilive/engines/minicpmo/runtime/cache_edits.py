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
which it owns then), a group of layers at a time (every layer's buffer is a
view of one tensor). On CUDA, bfloat16 keys are turned by one kernel
(:mod:`~omnilive.engines.minicpmo.runtime.turn_kernel`) with the same bits;
elsewhere by the torch operations here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from omnilive.engines.minicpmo.runtime import turn_kernel
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
        stacked = cls.of_moves(keys, [(old_start, new_start)], theta)
        return cls(*(table[0] for table in stacked.tables()))

    @classmethod
    def of_moves(
        cls, keys: torch.Tensor, moves: Sequence[tuple[int, int]], theta: float
    ) -> Rotation:
        """Every ``(old_start, new_start)`` of ``moves``, its angles stacked
        ``[moves, n, head_dim]``. The positions are device-side sums: a tensor
        made from a Python list would be a copy from the host, which waits for
        the GPU's queued work."""
        n, head_dim = keys.shape[-2], keys.shape[-1]
        steps = torch.arange(n, device=keys.device, dtype=torch.long)
        olds, news = (torch.cat([steps + move[k] for move in moves]) for k in (0, 1))
        cos_old, sin_old = rotary_angles(head_dim, olds, theta, keys.dtype)
        cos_new, sin_new = rotary_angles(head_dim, news, theta, keys.dtype)
        return cls(*(t.view(len(moves), n, head_dim) for t in (cos_old, sin_old, cos_new, sin_new)))

    def tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cos_old, self.sin_old, self.cos_new, self.sin_new

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


# Layers edited together: one launch of each of the torch rule's elementwise
# kernels (or of the turning kernel) per group instead of per layer (a
# window's edit runs on the batch loop's thread between every session's
# steps), the group's copy a few hundred MB at most at full size.
LAYER_GROUP = 12


def _groups(layers: int) -> list[slice]:
    return [slice(i, i + LAYER_GROUP) for i in range(0, layers, LAYER_GROUP)]


def _turner(
    sample: torch.Tensor, moves: Sequence[tuple[int, int]], theta: float, kernel: bool | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """What turns keys shaped like ``sample`` ``[layers, heads, n, head_dim]``
    by each ``(old_start, new_start)`` of ``moves`` in order, into a new
    tensor; the angles computed once for every group of layers. ``kernel``:
    by :mod:`~omnilive.engines.minicpmo.runtime.turn_kernel` (None: where it
    serves, keys in bfloat16 on CUDA), the same bits as the torch rule."""
    if turn_kernel.serves(sample) if kernel is None else kernel:
        tables = Rotation.of_moves(sample, moves, theta).tables()
        return lambda keys: turn_kernel.turned_keys(keys, *tables)
    turns = [_realigner(sample, old, new, theta) for old, new in moves]

    def turned(keys: torch.Tensor) -> torch.Tensor:
        out = keys
        for turn in turns:
            out = turn(out)
        return out if out is not keys else keys.clone()

    return turned


def drop_positions(
    cache: SlotCache,
    slot: int,
    start: int,
    lengths: int | Sequence[int],
    theta: float,
    *,
    kernel: bool | None = None,
) -> None:
    """Remove ``lengths`` positions at ``start`` of ``slot``, or several runs
    of them one after another (a basic window's units, each at ``start``
    once the one before it is gone); the positions after them move down,
    their keys re-rotated.

    Several runs leave the same bits as one drop per run: each key that
    stays is turned once per run, from where it stood to where that run's
    drop puts it, as the model code drops its units one at a time; but the
    keys of the units dropped later are never turned, and what stays is
    read and written once, a group of layers at a time. ``kernel``: as in
    :func:`_turner`."""
    runs = [n for n in ([lengths] if isinstance(lengths, int) else lengths) if n > 0]
    end, total = cache.lengths[slot], sum(runs)
    if not runs:
        return
    if not 0 <= start <= start + total <= end:
        raise ValueError(f"slot {slot} holds {end} positions: cannot drop {start}+{total}")
    moved = end - start - total
    if moved:
        kept, to = slice(start + total, end), slice(start, start + moved)
        moves, after = [], total
        for n in runs:  # run j: what stays stands at start + n + the runs after it
            after -= n
            moves.append((start + n + after, start + after))
        turn = _turner(cache.keys[:, slot, :, kept], moves, theta, kernel)
        for group in _groups(len(cache.key_cache)):
            cache.keys[group, slot, :, to] = turn(cache.keys[group, slot, :, kept])
            cache.values[group, slot, :, to] = cache.values[group, slot, :, kept].clone()
    cache.crop(slot, end - total)


@dataclass
class Lifted:
    """Positions lifted out of a slot (every layer's keys and values
    ``[layers, heads, n, head_dim]``), and where they stood."""

    start: int
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.keys.shape[-2])


def lift_positions(cache: SlotCache, slot: int, start: int) -> Lifted:
    """Copies of ``slot``'s positions from ``start`` to its end; the slot is
    cropped to ``start``."""
    end = cache.lengths[slot]
    keys = cache.keys[:, slot, :, start:end].clone()
    values = cache.values[:, slot, :, start:end].clone()
    cache.crop(slot, start)
    return Lifted(start, keys, values)


def put_back(
    cache: SlotCache, slot: int, lifted: Lifted, theta: float, *, kernel: bool | None = None
) -> None:
    """``lifted`` appended at ``slot``'s end, its keys re-rotated to stand
    there (``kernel``: as in :func:`drop_positions`)."""
    at, n = cache.lengths[slot], lifted.length
    if at + n > cache.capacity:
        raise ValueError(f"slot {slot}: {n} positions after {at} pass its capacity")
    if n:
        to = slice(at, at + n)
        if lifted.start == at:
            cache.keys[:, slot, :, to] = lifted.keys
        else:
            turn = _turner(lifted.keys, [(lifted.start, at)], theta, kernel)
            for group in _groups(len(cache.key_cache)):
                cache.keys[group, slot, :, to] = turn(lifted.keys[group])
        cache.values[:, slot, :, to] = lifted.values
    cache.lengths[slot] = at + n
