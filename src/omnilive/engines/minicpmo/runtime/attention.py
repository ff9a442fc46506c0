"""Attention over the K/V buffers of many sessions' slots, for
:mod:`omnilive.engines.minicpmo.runtime.batch`: registered with transformers under
its own names and selected only for the duration of a batched step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SLOT_ATTENTION = "omnilive_slots"
"""The name :func:`slot_attention` has in transformers' attention registry."""
GQA_SLOT_ATTENTION = "omnilive_slots_gqa"
"""The name of :func:`gqa_slot_attention`, kept to be measured against it."""

# --- attention over the slots' views ---------------------------------------------------
#
# transformers' own "sdpa" repeats every K/V head for its query heads (repeat_kv:
# a copy of K and V, four times their size for Qwen3-8B's 32/8 heads, per layer
# and step) and makes K/V contiguous (another copy of a strided view). Both
# functions below hand the views to SDPA as they are.
#
# Which SDPA kernels take grouped heads *and* a mask on CUDA, as far as torch's
# docstring (2.13, in our venv) and aten's sdp_utils.cpp tell:
# - flash: grouped heads yes, masks never (``check_for_attn_mask``);
# - memory-efficient: masks yes, grouped heads only since pytorch PR 191085
#   (mid 2026): not in the torch 2.11 we run on GPUs;
# - cuDNN: both (masks shaped [B or 1, 1 or H, L, S]); torch tries it first only
#   on sm90/sm100 with cuDNN > 9.15 (reportedly what 2.11's wheels bundle),
#   otherwise after math, i.e. never;
# - math: everything, by repeating K/V itself and materialising fp32 scores.
# So ``enable_gqa=True`` with a mask (gqa_slot_attention) is fast only where
# cuDNN takes it. slot_attention folds each K/V head's query heads into query
# rows instead: the same number of query and K/V heads, which every fused kernel
# that takes a mask accepts, and each K/V head is read once for its whole group.
# benchmarks/gpu_batch_steps.py measures both and records which kernels ran.


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    enable_gqa: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA over ``key``/``value`` ``[B, kv_heads, S, dim]`` as given, without
    copying them: the ``group`` query heads of each K/V head become its query
    rows ``[B, kv_heads, group * L, dim]`` and the mask ``[B, 1, L, S]`` is
    repeated per group. Exact: each query row gets the scores, softmax and
    output of its own head; only the kernel's row order changes.

    ``enable_gqa`` hands the heads unfolded to SDPA's own grouped heads
    instead (see above for the kernels that take them with a mask)."""
    if attention_mask is None or attention_mask.shape[1] != 1:
        # No per-row mask to repeat: not one of our steps, the stock path.
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    mask = attention_mask[..., : key.shape[2]]
    if enable_gqa:
        out = scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    batch, heads, length, dim = query.shape
    group = heads // key.shape[1]
    # repeat_kv gives query head h the K/V head h // group: K/V head k takes
    # query heads k * group + g, as rows g * length + i.
    folded = query.reshape(batch, key.shape[1], group * length, dim)
    out = scaled_dot_product_attention(
        folded, key, value, attn_mask=mask.repeat(1, 1, group, 1), dropout_p=dropout, scale=scaling
    )
    # reshape, not view: a kernel may hand its output back in another layout.
    return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


def gqa_slot_attention(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """:func:`slot_attention` through SDPA's ``enable_gqa=True`` with the mask."""
    return slot_attention(*args, enable_gqa=True, **kwargs)


def register_attention() -> None:
    """Make both functions known to transformers (idempotent; every
    :class:`BatchedSteps` does it, so importing this module changes nothing)."""
    AttentionInterface.register(SLOT_ATTENTION, slot_attention)
    AttentionInterface.register(GQA_SLOT_ATTENTION, gqa_slot_attention)


@contextmanager
def attention_named(config: Any, name: str | None) -> Iterator[None]:
    """transformers 4.51 picks a layer's attention function at every call from
    ``module.config._attn_implementation``, and that config object is the whole
    model's (the causal LM's and every layer's). So ``name`` is set there only
    for the duration of one of our forwards and restored after it, failed or
    not: other users of the model never see it, unless they run it from another
    thread during a step (the engine runs one step at a time), and even then
    both functions are exact for any transformers mask."""
    if name is None:
        yield
        return
    saved = config._attn_implementation_internal  # (the property reads None as "eager")
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation_internal = saved
