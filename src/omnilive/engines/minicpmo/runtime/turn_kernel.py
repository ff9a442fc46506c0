"""One Triton kernel for :mod:`~omnilive.engines.minicpmo.runtime.cache_edits`:
the keys a window's edit moves, turned by all of its rotations in one pass.

A slide of a basic window turns each key that stays once per unit let go
(the model code drops its units one at a time), each turn ten elementwise
operations, each rounded to the cache's dtype. As torch operations over a
slot's 4,000 kept positions that is ten kernels a turn over every layer's
keys, ~21 ms of an H200 for a slide of six units while every session's
batches wait; here each key is read once, turned by every turn in
registers, and written once.

The bits are torch's: every operation is computed in float32 and rounded
to bfloat16 (round to nearest, ties to even) where torch rounds it, by
:func:`_round_bf16` on the float's bits rather than by a conversion, so the
kernel rounds the same compiled on a GPU and in Triton's interpreter (whose
own conversion to bfloat16 truncates), and no product can be fused with the
sum after it. Only bfloat16 caches take it (the GPU engine's); others keep
the torch rule.
"""

from __future__ import annotations

import torch

from omnilive.engines.minicpmo.runtime.kernels import AVAILABLE, KernelChoice

KERNEL = KernelChoice("the window's key-turning kernel")
# Positions a program turns at once (of one layer's head).
BLOCK_POSITIONS = 16


def serves(keys: torch.Tensor) -> bool:
    """Whether :func:`turned_keys` runs for ``keys`` (else the torch rule)."""
    return keys.dtype == torch.bfloat16 and KERNEL.uses(keys.device)


def turned_keys(
    keys: torch.Tensor,
    cos_old: torch.Tensor,
    sin_old: torch.Tensor,
    cos_new: torch.Tensor,
    sin_new: torch.Tensor,
) -> torch.Tensor:
    """``keys`` ``[layers, heads, n, head_dim]`` (bfloat16, any strides)
    turned by each of the turns in order: turn ``j`` takes the keys from the
    angles ``cos_old[j]``/``sin_old[j]`` ``[n, head_dim]`` to ``cos_new[j]``/
    ``sin_new[j]``, as ``cache_edits.Rotation.apply`` does. A new tensor."""
    layers, heads, n, dim = keys.shape
    out = torch.empty((layers, heads, n, dim), dtype=keys.dtype, device=keys.device)
    if n == 0 or layers == 0:
        return out
    tables = [t.to(keys.dtype).contiguous() for t in (cos_old, sin_old, cos_new, sin_new)]
    grid = (triton.cdiv(n, BLOCK_POSITIONS), heads, layers)
    turns = tables[0].shape[0]
    strides = keys.stride()[:3]  # layer, head, position
    _turn_kernel[grid](
        keys, *tables, out, n, turns, *strides, H=heads, D=dim, BLOCK=BLOCK_POSITIONS
    )
    return out


def warm(keys: torch.Tensor) -> None:
    """Compile the kernel for keys laid out as ``keys`` (a slot's view of
    every layer: ``[layers, heads, columns, head_dim]``) now, not at a
    call's first slide; a kernel that fails leaves the torch rule."""
    if keys.dtype != torch.bfloat16 or keys.device.type != "cuda":
        return
    sample = keys[:, :, :1]
    table = torch.ones(1, 1, keys.shape[-1], dtype=keys.dtype, device=keys.device)
    KERNEL.warm(lambda: turned_keys(sample, table, table, table, table), keys.device)


if AVAILABLE:
    import triton
    import triton.language as tl

    @triton.jit
    def _round_bf16(x):
        """float32 ``x`` rounded to the nearest bfloat16 (ties to even), as float32."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit(do_not_specialize=["n", "turns"])
    def _turn_kernel(
        X,
        COS_OLD,
        SIN_OLD,
        COS_NEW,
        SIN_NEW,
        Y,
        n,
        turns,
        stride_layer,
        stride_head,
        stride_position,
        H: tl.constexpr,
        D: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        block, head, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = block * BLOCK + tl.arange(0, BLOCK)
        half = tl.arange(0, D // 2)
        inside = (rows < n)[:, None]
        at = X + layer * stride_layer + head * stride_head + rows[:, None] * stride_position
        x1 = tl.load(at + half[None, :], mask=inside, other=0.0).to(tl.float32)
        x2 = tl.load(at + D // 2 + half[None, :], mask=inside, other=0.0).to(tl.float32)
        turn = 0
        while turn < turns:  # not range(): Triton's interpreter takes no runtime bound
            row = (turn * n + rows[:, None]) * D + half[None, :]
            co1 = tl.load(COS_OLD + row, mask=inside, other=0.0).to(tl.float32)
            co2 = tl.load(COS_OLD + row + D // 2, mask=inside, other=0.0).to(tl.float32)
            so1 = tl.load(SIN_OLD + row, mask=inside, other=0.0).to(tl.float32)
            so2 = tl.load(SIN_OLD + row + D // 2, mask=inside, other=0.0).to(tl.float32)
            cn1 = tl.load(COS_NEW + row, mask=inside, other=0.0).to(tl.float32)
            cn2 = tl.load(COS_NEW + row + D // 2, mask=inside, other=0.0).to(tl.float32)
            sn1 = tl.load(SIN_NEW + row, mask=inside, other=0.0).to(tl.float32)
            sn2 = tl.load(SIN_NEW + row + D // 2, mask=inside, other=0.0).to(tl.float32)
            # base = cos_old * x - sin_old * rotate_half(x), rotate_half(x) = (-x2, x1)
            b1 = _round_bf16(_round_bf16(co1 * x1) - _round_bf16(so1 * -x2))
            b2 = _round_bf16(_round_bf16(co2 * x2) - _round_bf16(so2 * x1))
            # cos_new * base + sin_new * rotate_half(base)
            x1 = _round_bf16(_round_bf16(cn1 * b1) + _round_bf16(sn1 * -b2))
            x2 = _round_bf16(_round_bf16(cn2 * b2) + _round_bf16(sn2 * b1))
            turn += 1
        to = Y + ((layer * H + head) * n + rows[:, None]) * D
        tl.store(to + half[None, :], x1.to(Y.dtype.element_ty), mask=inside)
        tl.store(to + D // 2 + half[None, :], x2.to(Y.dtype.element_ty), mask=inside)
