"""The batched steps' forward of a decoder, written out layer by layer over
the model's own modules and weights, for
:class:`~omnilive.engines.minicpmo.runtime.batch.BatchedSteps`.

transformers' forward of a Qwen3/Llama decoder is some fifty kernels a
layer for a decoding step of a few rows: separate query/key/value and
gate/up products, RMSNorm as six elementwise kernels, rotary embedding as
eight, a copy of each step's keys and values into the cache, and attention
that reads every column of a width bucket (after an ``index_select`` copy of
the rows' buffers when the slots are not neighbours). :class:`FusedDecoder`
computes the same function with:

- one product for query, key and value and one for gate and up: the
  modules' weights become row views of one fused tensor each (no memory
  added; the model's own code, which reads the modules, sees the same
  values);
- with :mod:`~omnilive.engines.minicpmo.runtime.kernels` (CUDA, or Triton's
  interpreter in the tests): the residual adds and norms, the head norms,
  rotary and cache writes, and the activation as one kernel each, and a
  short step's attention (:data:`SHORT_STEP` positions a row or fewer) as a
  split-column kernel over each row's own slot that reads only the columns
  it may see;
- otherwise the model's own modules for those parts (the norms, rotary as
  transformers writes it) and SDPA over the plan's view of the buffers
  (:func:`~omnilive.engines.minicpmo.runtime.attention.slot_attention`), as the
  stock forward with slot attention computes it: the CPU path, held to the
  stock forward by the tests.

The final norm runs on each row's last real position only (all a step returns).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import linear
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from omnilive.engines.minicpmo.runtime import kernels
from omnilive.engines.minicpmo.runtime.attention import slot_attention
from omnilive.engines.minicpmo.runtime.batch import StepPlan, rows_view, write_rows
from omnilive.engines.minicpmo.runtime.graphs import SHORT_STEP


def unsupported(backbone: Any) -> str | None:
    """Why :class:`FusedDecoder` cannot run ``backbone``, or ``None``."""
    config = backbone.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r} (only silu)"
    if getattr(config, "mlp_bias", False):
        return "an MLP with biases"
    for layer in backbone.layers:
        attention = layer.self_attn
        if getattr(attention, "sliding_window", None) is not None:
            return "sliding-window attention"
        if not all(hasattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return f"attention of type {type(attention).__name__}"
        if hasattr(attention, "q_norm") != hasattr(attention, "k_norm"):
            return "a norm on only one of query and key"
    return None


def fuse_rows(linears: list[Any]) -> torch.Tensor:
    """One ``[sum of outputs, inputs]`` weight for ``linears``; each module's
    weight becomes a view of its rows (the same values, no second copy)."""
    fused = torch.cat([module.weight.detach() for module in linears], 0)
    offset = 0
    for module in linears:
        rows = module.weight.shape[0]
        module.weight.data = fused[offset : offset + rows]
        offset += rows
    return fused


def _fused_bias(linears: list[Any]) -> torch.Tensor | None:
    biases = [module.bias for module in linears]
    if all(bias is None for bias in biases):
        return None
    return torch.cat(
        [
            bias.detach() if bias is not None else module.weight.new_zeros(module.weight.shape[0])
            for bias, module in zip(biases, linears, strict=True)
        ]
    )


class _Layer:
    """One decoder layer's modules, with its products fused."""

    def __init__(self, layer: Any) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        projections = [attention.q_proj, attention.k_proj, attention.v_proj]
        self.qkv = fuse_rows(projections)
        self.qkv_bias = _fused_bias(projections)
        self.o_proj = attention.o_proj
        self.gate_up = fuse_rows([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.act = mlp.act_fn
        self.input_norm = layer.input_layernorm
        self.post_norm = layer.post_attention_layernorm
        self.q_norm = getattr(attention, "q_norm", None)
        self.k_norm = getattr(attention, "k_norm", None)

    def head_norms(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        if self.q_norm is None:
            return None
        return self.q_norm.weight, self.k_norm.weight, float(self.q_norm.variance_epsilon)


class FusedDecoder:
    """:meth:`forward` computes what ``backbone(inputs_embeds=..., ...)`` of
    :meth:`BatchedSteps.run` computes, then the final norm of each row's last
    position (see the module). ``use_kernels``: the Triton kernels (where
    Triton is installed), else the torch path."""

    def __init__(self, backbone: Any, *, use_kernels: bool) -> None:
        reason = unsupported(backbone)
        if reason is not None:
            raise ValueError(f"the fused decoder does not run {reason}")
        config = backbone.config
        attention = backbone.layers[0].self_attn
        head_dim = attention.head_dim
        self.heads = (config.num_attention_heads, config.num_key_value_heads, head_dim)
        self.scale = float(attention.scaling)
        self.rotary = backbone.rotary_emb
        self.final_norm = backbone.norm
        self.layers = [_Layer(layer) for layer in backbone.layers]
        self.use_kernels = use_kernels and kernels.AVAILABLE

    def reads_own_columns(self, length: int) -> bool:
        """Whether a step of ``length`` positions a row reads only the
        columns each row may see, whatever width its plan has (the
        split-column kernel): such a step costs the same at any width."""
        return self.use_kernels and length <= SHORT_STEP

    def forward(self, embeds: torch.Tensor, plan: StepPlan, cache: Any) -> torch.Tensor:
        """``embeds`` ``[B, L, hidden]`` through every layer, writing each
        row's new keys and values into ``cache`` (a
        :class:`~omnilive.engines.minicpmo.runtime.batch.SlotCache`) where ``plan``
        says; returns each row's last real position's hidden state ``[B, hidden]``."""
        batch, length, hidden = embeds.shape
        cos, sin = self.rotary(embeds, plan.positions)
        x = embeds.reshape(batch * length, hidden)
        h, residual = self._norm(self.layers[0].input_norm, x, None)
        mlp = x
        for index, layer in enumerate(self.layers):
            if index:
                h, residual = self._norm(layer.input_norm, mlp, residual)
            qkv = linear(h, layer.qkv, layer.qkv_bias)
            caches = (cache.key_cache[index], cache.value_cache[index])
            q = self._queries(layer, qkv, cos, sin, caches, plan)
            attended = self._attend(q, caches, plan, length)
            out = layer.o_proj(attended.reshape(batch * length, -1))
            h, residual = self._norm(layer.post_norm, out, residual)
            mlp = layer.down_proj(self._activate(layer, linear(h, layer.gate_up)))
        last = torch.arange(batch, device=x.device) * length + plan.last
        final, _ = self._norm(self.final_norm, mlp[last], residual[last])
        return final

    # --- the parts, each kernel or torch -------------------------------------------

    def _norm(
        self, norm: Any, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` (no residual: of ``x``)."""
        if self.use_kernels:
            return kernels.rms_norm(x, norm.weight, float(norm.variance_epsilon), residual)
        summed = x if residual is None else residual + x
        return norm(summed), summed

    def _queries(
        self,
        layer: _Layer,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        caches: tuple[torch.Tensor, torch.Tensor],
        plan: StepPlan,
    ) -> torch.Tensor:
        """The step's queries ``[B * L, HQ, D]``, its keys and values written."""
        if self.use_kernels:
            return kernels.qk_rope_write(
                qkv, cos, sin, self.heads, layer.head_norms(), caches, plan.rows, plan.write
            )
        hq, hk, d = self.heads
        tokens = qkv.shape[0]
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
        q, k, v = q.view(tokens, hq, d), k.view(tokens, hk, d), v.view(tokens, hk, d)
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        # transformers' own rotary (Qwen3's and Llama's are the same function).
        q, k = apply_rotary_pos_emb(q, k, cos.reshape(tokens, d), sin.reshape(tokens, d))
        batch, length = plan.write.shape
        for buffer, states in zip(caches, (k, v), strict=True):
            write_rows(buffer, plan, states.view(batch, length, hk, d))
        return q

    def _attend(
        self,
        q: torch.Tensor,
        caches: tuple[torch.Tensor, torch.Tensor],
        plan: StepPlan,
        length: int,
    ) -> torch.Tensor:
        if self.use_kernels and length <= SHORT_STEP:
            return kernels.decode_attention(
                q, caches, plan.rows, plan.limit, self.scale, plan.width
            )
        hq, _, d = self.heads
        batch = plan.write.shape[0]
        keys, values = (rows_view(buffer, plan) for buffer in caches)
        query = q.view(batch, length, hq, d).transpose(1, 2)
        out, _ = slot_attention(None, query, keys, values, plan.mask, scaling=self.scale)  # type: ignore[arg-type]  # module is unread with a [B, 1, L, S] mask
        return out.reshape(batch * length, hq, d)

    def _activate(self, layer: _Layer, gate_up: torch.Tensor) -> torch.Tensor:
        if self.use_kernels:
            return kernels.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return layer.act(gate) * up
