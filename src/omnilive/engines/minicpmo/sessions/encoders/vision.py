"""The vision encoder of slot sessions: the model code's
``get_vision_embedding`` (SigLIP, then the resampler) restated over the
model's own modules, the same arithmetic in fewer passes and waits.

- The attention keeps the model code's eager arithmetic (scores in the
  model's dtype, scaled, a float32 softmax rounded back) but takes the
  softmax with the model's dtype out: the same float32 kernel rounding once
  as it writes, where the model code writes float32 and rounds it in one
  more pass over the largest tensors of the encoder (the same embeddings,
  to the bit: 90 ms instead of 116 over 12 frames on an H100,
  ``benchmarks/results/gpu_vision_exact_nvidia_h100.json``). Fused attention
  (``scaled_dot_product_attention``) was 2.8 times faster at 12 frames on
  an H100 but keeps the scores in float32, and the duplex equality harness
  then found 4 of 64 units deciding otherwise
  (``benchmarks/results/gpu_vision_sdpa_nvidia_h100.json``): it is not used.
- The patch mask stays on the CPU, where the embeddings read it a frame at
  a time (each read of a GPU mask waits for the stream); the attention's
  key mask goes to the GPU once, and not at all when no frame is padded.
- On CUDA the encoder's layers (nearly all of its ~430 kernels a call)
  replay as a CUDA graph per input shape
  (:class:`~omnilive.engines.minicpmo.runtime.block_graphs.BlockGraphs`,
  made by :meth:`~omnilive.engines.minicpmo.sessions.shared.SharedModel.vision_layers`):
  a call at one frame is bound by launching them one at a time, on the
  encoders' lane, whose thread shares the interpreter with the batch loop's
  and the side lane's. A replay runs the kernels the capture recorded, so
  the embeddings are the eager layers' to the bit. The patch embeddings and
  the resampler stay eager: they read the slices' sizes on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# SigLIP's layers and its last norm over ``(hidden, *allowed)`` (``allowed``:
# the key mask, absent when no frame is padded), a tuple of one tensor out: the
# shape :class:`~omnilive.engines.minicpmo.runtime.block_graphs.BlockGraphs` replays.
Layers = Callable[..., tuple[torch.Tensor, ...]]


def fused_vision(model: Any) -> bool:
    """Whether :func:`vision_embeddings` restates this model's vision
    encoder: a SigLIP (``vpm``) of pre-norm layers, then the resampler."""
    layers = getattr(getattr(getattr(model, "vpm", None), "encoder", None), "layers", None)
    return (
        layers is not None
        and hasattr(model, "resampler")
        and all(hasattr(layer, "layer_norm1") and hasattr(layer, "mlp") for layer in layers)
    )


def vision_embeddings(
    model: Any,
    pixel_values: list[list[torch.Tensor]],
    tgt_sizes: list[Any],
    layers: Layers | None = None,
) -> list[Any]:
    """Per item of ``pixel_values`` (each a list of slices ``[3, 14, n]`` on
    the model's device), its slices' embeddings ``[slices, queries, hidden]``
    (``[]`` for an item without slices), as ``get_vision_embedding`` makes
    them. ``tgt_sizes``: every item's slice sizes (tensors ``[slices, 2]``,
    on the CPU). ``layers``: SigLIP's layers as :func:`encoder_layers` runs
    them, or through graphs of them (None: eagerly)."""
    layers = layers or encoder_layers(model.vpm)
    dtype = model.llm.model.embed_tokens.weight.dtype
    counts = [len(item) for item in pixel_values]
    flat = [piece.flatten(end_dim=1).permute(1, 0) for item in pixel_values for piece in item]
    if not flat:
        return [[] for _ in pixel_values]
    sizes = torch.vstack([size for size in tgt_sizes if isinstance(size, torch.Tensor)])
    sizes = sizes.to(torch.int32).cpu()
    patches = (sizes[:, 0] * sizes[:, 1]).tolist()
    padded = torch.nn.utils.rnn.pad_sequence(flat, batch_first=True, padding_value=0.0)
    rows, length, _ = padded.shape
    pixels = padded.permute(0, 2, 1).reshape(rows, 3, -1, length).to(dtype)
    mask = torch.zeros((rows, 1, max(patches)), dtype=torch.bool)
    for row, count in enumerate(patches):
        mask[row, 0, :count] = True
    step = int(model.config.vision_batch_size)
    parts = []
    for start in range(0, rows, step):
        part = slice(start, start + step)
        parts.append(_siglip(model.vpm, layers, pixels[part], mask[part], sizes[part]))
    embedded = model.resampler(torch.cat(parts), sizes)
    results: list[Any] = []
    start = 0
    for count in counts:
        results.append(embedded[start : start + count] if count else [])
        start += count
    return results


def _siglip(
    vpm: Any, layers: Layers, pixels: torch.Tensor, mask: torch.Tensor, sizes: torch.Tensor
) -> torch.Tensor:
    """SigLIP's last hidden state over ``pixels`` (the model's
    ``SiglipVisionTransformer.forward``, its layers ``layers``)."""
    hidden = vpm.embeddings(pixel_values=pixels, patch_attention_mask=mask, tgt_sizes=sizes)
    keys = mask.view(mask.shape[0], -1)
    # What each query's scores get added (``[rows, 1, 1, patches]``: the
    # dtype's lowest at a padded key), or None when no frame is padded (the
    # model code passes no mask then either).
    allowed = None
    if not bool(keys.all()):
        lowest = torch.finfo(hidden.dtype).min
        added = torch.zeros(keys.shape, dtype=hidden.dtype).masked_fill(~keys, lowest)
        allowed = added[:, None, None, :].to(hidden.device)
    (last,) = layers(hidden) if allowed is None else layers(hidden, allowed)
    return last


def encoder_layers(vpm: Any) -> Layers:
    """SigLIP's layers, then its last norm (:data:`Layers`; the attention as
    :func:`_attention`): branches on no value, so it captures as a graph."""

    def run(hidden: torch.Tensor, *allowed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = allowed[0] if allowed else None
        for layer in vpm.encoder.layers:
            hidden = hidden + _attention(layer.self_attn, layer.layer_norm1(hidden), mask)
            hidden = hidden + layer.mlp(layer.layer_norm2(hidden))
        return (vpm.post_layernorm(hidden),)

    return run


def _attention(attention: Any, hidden: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """``SiglipAttention.forward``'s arithmetic. Its float32 softmax rounded
    back equals a softmax with the model's dtype out: the same kernel computes
    in float32 either way and rounds once as it writes."""
    rows, length, _ = hidden.shape
    shape = (rows, length, attention.num_heads, attention.head_dim)
    query = attention.q_proj(hidden).view(shape).transpose(1, 2)
    key = attention.k_proj(hidden).view(shape).transpose(1, 2)
    value = attention.v_proj(hidden).view(shape).transpose(1, 2)
    scores = torch.matmul(query, key.transpose(2, 3)) * attention.scale
    if allowed is not None:
        scores = scores + allowed
    out = torch.matmul(torch.softmax(scores, dim=-1), value)
    return attention.out_proj(out.transpose(1, 2).reshape(rows, length, attention.embed_dim))
