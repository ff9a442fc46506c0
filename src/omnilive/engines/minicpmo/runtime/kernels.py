"""Triton kernels of :mod:`omnilive.engines.minicpmo.runtime.fused_decoder`: what a
decoder layer does between its matrix products, a few launches instead of
dozens.

A decoding step of the batched engine is a few rows through 36 layers; inside
a CUDA graph its cost is the weights' bytes (the matrix products) plus some
fifty small kernels a layer (RMSNorm's casts and reductions, rotary halves,
residual adds, the activation), each a few microseconds for a few rows. Here
each of those runs is one kernel:

- :func:`rms_norm`: the residual add and the RMSNorm after it;
- :func:`qk_rope_write`: the query/key head norms (Qwen3), rotary embedding,
  and the new keys and values written into their slots' cache columns;
- :func:`silu_mul`: the MLP's ``silu(gate) * up``;
- :func:`decode_attention`: attention of a short step's queries over each
  row's own slot, reading only the columns the row can see (split over the
  columns, then merged), with no copy of the slot's keys and values.

Each follows the rounding of the model's own torch code (an op's result
rounded to the model's dtype where torch rounds it), so the fused forward
stays within the model's own numerical noise. On a CUDA device the kernels
are compiled; the tests run them in Triton's interpreter on the CPU. Without
Triton installed :data:`AVAILABLE` is false and the fused forward runs its
torch path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the CPU server needs no Triton
    AVAILABLE = False
else:
    # Compiled on a GPU. Without one, only in a process that set
    # TRITON_INTERPRET=1 before Triton was first imported (the tests do; every
    # @triton.jit function, Triton's own such as tl.sum, is decided then).
    AVAILABLE = torch.cuda.is_available() or bool(triton.knobs.runtime.interpret)

log = logging.getLogger(__name__)


class KernelChoice:
    """Whether a kernel runs (on CUDA, where Triton is), decided
    at warm-up: a kernel that fails to compile (a Triton or GPU it was never
    built on) leaves its tensor rule to every session, with one warning,
    instead of stopping the engine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.on = AVAILABLE

    def uses(self, device: torch.device) -> bool:
        return device.type == "cuda" and self.on

    def warm(self, choose: Callable[[], object], device: torch.device) -> None:
        """``choose()`` (a choice on ``device``), again with the tensor rule if
        the kernel fails."""
        try:
            choose()
        except Exception as exc:  # any compile failure: the tensor rule still works
            if not self.uses(device):
                raise
            log.warning("%s failed (%s): its tensor rule runs", self.name, exc)
            self.on = False
            choose()


# A decode attention program reads this many cache columns at a time.
BLOCK_COLUMNS = 64
# Each row's columns are read by this many programs per K/V head (8 rows x 8
# K/V heads x 8 = 512 programs for an H200's 132 multiprocessors). One count
# for every batch: each distinct count is a kernel compiled at start.
SPLITS = 8

if AVAILABLE:

    @triton.jit
    def _rms_norm_kernel(X, R, W, Y, RES, n, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < n
        x = tl.load(X + row * n + cols, mask=inside, other=0.0)
        if HAS_RESIDUAL:
            # residual + hidden, rounded to the model's dtype: the new residual.
            r = tl.load(R + row * n + cols, mask=inside, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(Y.dtype.element_ty)
            tl.store(RES + row * n + cols, x, mask=inside)
        xf = x.to(tl.float32)
        variance = tl.sum(xf * xf, axis=0) / n
        normed = (xf * (1.0 / tl.sqrt(variance + eps))).to(Y.dtype.element_ty)
        w = tl.load(W + cols, mask=inside, other=0.0)
        y = w.to(tl.float32) * normed.to(tl.float32)
        tl.store(Y + row * n + cols, y.to(Y.dtype.element_ty), mask=inside)

    @triton.jit
    def _qk_rope_write_kernel(
        QKV,
        COS,
        SIN,
        QW,
        KW,
        Q,
        KC,
        VC,
        ROWS,
        WRITE,
        eps,
        L,
        stride_qkv,
        stride_slot,
        stride_head,
        stride_col,
        HQ: tl.constexpr,
        HK: tl.constexpr,
        D: tl.constexpr,
        HAS_NORM: tl.constexpr,
    ):
        token = tl.program_id(0)  # b * L + i
        head = tl.program_id(1)  # query heads, then key heads, then value heads
        half = tl.arange(0, D // 2)
        base = QKV + token * stride_qkv + head * D
        dtype = Q.dtype.element_ty
        if head < HQ + HK:
            x1 = tl.load(base + half).to(tl.float32)
            x2 = tl.load(base + D // 2 + half).to(tl.float32)
            if HAS_NORM:  # Qwen3's RMSNorm of each head, rounded as torch rounds it
                if head < HQ:
                    w1 = tl.load(QW + half).to(tl.float32)
                    w2 = tl.load(QW + D // 2 + half).to(tl.float32)
                else:
                    w1 = tl.load(KW + half).to(tl.float32)
                    w2 = tl.load(KW + D // 2 + half).to(tl.float32)
                variance = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D
                scale = 1.0 / tl.sqrt(variance + eps)
                x1 = (w1 * (x1 * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
                x2 = (w2 * (x2 * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
            c1 = tl.load(COS + token * D + half).to(tl.float32)
            c2 = tl.load(COS + token * D + D // 2 + half).to(tl.float32)
            s1 = tl.load(SIN + token * D + half).to(tl.float32)
            s2 = tl.load(SIN + token * D + D // 2 + half).to(tl.float32)
            # x * cos + rotate_half(x) * sin, each product rounded, then the sum.
            a1 = (x1 * c1).to(dtype).to(tl.float32)
            a2 = (x2 * c2).to(dtype).to(tl.float32)
            b1 = (-x2 * s1).to(dtype).to(tl.float32)
            b2 = (x1 * s2).to(dtype).to(tl.float32)
            o1 = (a1 + b1).to(dtype)
            o2 = (a2 + b2).to(dtype)
            if head < HQ:
                out = Q + (token * HQ + head) * D
                tl.store(out + half, o1)
                tl.store(out + D // 2 + half, o2)
            else:
                b = token // L
                slot = tl.load(ROWS + b)
                column = tl.load(WRITE + token)
                out = KC + slot * stride_slot + (head - HQ) * stride_head + column * stride_col
                tl.store(out + half, o1.to(KC.dtype.element_ty))
                tl.store(out + D // 2 + half, o2.to(KC.dtype.element_ty))
        else:
            b = token // L
            slot = tl.load(ROWS + b)
            column = tl.load(WRITE + token)
            dims = tl.arange(0, D)
            v = tl.load(base + dims)
            out = VC + slot * stride_slot + (head - HQ - HK) * stride_head + column * stride_col
            tl.store(out + dims, v.to(VC.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(GU, Y, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < n
        g = tl.load(GU + row * 2 * n + cols, mask=inside, other=0.0).to(tl.float32)
        u = tl.load(GU + row * 2 * n + n + cols, mask=inside, other=0.0).to(tl.float32)
        dtype = Y.dtype.element_ty
        activated = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
        tl.store(Y + row * n + cols, (activated * u).to(dtype), mask=inside)

    @triton.jit
    def _attention_split_kernel(
        Q,
        KC,
        VC,
        ROWS,
        LIMIT,
        PART_ACC,
        PART_M,
        PART_L,
        scale,
        stride_slot,
        stride_head,
        stride_col,
        L: tl.constexpr,
        HQ: tl.constexpr,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr,
        BLOCKS: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        b = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        # Query row r of this K/V head: query head kv_head * G + r // L, position r % L.
        r = tl.arange(0, BLOCK_M)
        real = r < G * L
        position = r % L
        head = kv_head * G + r // L
        dims = tl.arange(0, D)
        q_rows = Q + ((b * L + position) * HQ + head) * D
        # float32 operands (tf32 products for bf16 inputs: exact, as a bf16
        # product is; this step is bound by reading the cache, not by the
        # products; and Triton's interpreter multiplies bf16 wrongly).
        q = tl.load(q_rows[:, None] + dims[None, :], mask=real[:, None], other=0.0)
        q = q.to(tl.float32)
        limit = tl.load(LIMIT + b * L + position, mask=real, other=-1)
        # Every row reads its own columns 0 .. seen - 1 (its last query sees
        # the most); this program every SPLITS-th block of them from its
        # split's on (interleaved, not a contiguous range: a row whose context
        # fills a fraction of the width still keeps every split busy, so one
        # width, the buffers' own, serves every context length).
        seen = tl.max(limit, axis=0) + 1
        slot = tl.load(ROWS + b)
        k_base = KC + slot * stride_slot + kv_head * stride_head
        v_base = VC + slot * stride_slot + kv_head * stride_head
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for block in range(BLOCKS):  # a constant count: graphs and the interpreter want one
            first = (block * SPLITS + split) * BLOCK_N
            if first < seen:
                cols = first + tl.arange(0, BLOCK_N)
                inside = cols < seen
                k = tl.load(
                    k_base + cols[None, :] * stride_col + dims[:, None],
                    mask=inside[None, :],
                    other=0.0,
                )
                scores = tl.dot(q, k.to(tl.float32), input_precision=PRECISION) * scale
                scores = tl.where(cols[None, :] <= limit[:, None], scores, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(scores, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.exp(scores - m_safe[:, None])
                alpha = tl.exp(m_i - m_safe)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(
                    v_base + cols[:, None] * stride_col + dims[None, :],
                    mask=inside[:, None],
                    other=0.0,
                )
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision=PRECISION)
                m_i = m_new
        part = (b * tl.num_programs(1) + kv_head) * SPLITS + split
        tl.store(PART_M + part * BLOCK_M + r, m_i)
        tl.store(PART_L + part * BLOCK_M + r, l_i)
        tl.store(PART_ACC + (part * BLOCK_M + r)[:, None] * D + dims[None, :], acc)

    @triton.jit
    def _attention_merge_kernel(
        PART_ACC,
        PART_M,
        PART_L,
        OUT,
        L: tl.constexpr,
        HQ: tl.constexpr,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        b = tl.program_id(0)
        kv_head = tl.program_id(1)
        r = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, D)
        first = (b * tl.num_programs(1) + kv_head) * SPLITS
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for split in tl.static_range(SPLITS):
            m = tl.maximum(m, tl.load(PART_M + (first + split) * BLOCK_M + r))
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for split in tl.static_range(SPLITS):
            part = (first + split) * BLOCK_M + r
            weight = tl.exp(tl.load(PART_M + part) - m_safe)
            total += weight * tl.load(PART_L + part)
            acc += weight[:, None] * tl.load(PART_ACC + part[:, None] * D + dims[None, :])
        # (Padding rows saw nothing: 0 / 0, never stored.)
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        real = r < G * L
        position = r % L
        head = kv_head * G + r // L
        rows = OUT + ((b * L + position) * HQ + head) * D
        tl.store(rows[:, None] + dims[None, :], out.to(OUT.dtype.element_ty), mask=real[:, None])


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(RMSNorm(x + residual), x + residual)`` over the last dimension of
    ``x`` ``[rows, n]`` (without ``residual``: of ``x``, and ``x`` itself)."""
    rows, n = x.shape
    y = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    block = triton.next_power_of_2(n)
    _rms_norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        weight,
        y,
        summed,
        n,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=4 if block <= 4096 else 8,
    )
    return y, summed


def qk_rope_write(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: tuple[int, int, int],
    norms: tuple[torch.Tensor, torch.Tensor, float] | None,
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
    write: torch.Tensor,
) -> torch.Tensor:
    """From ``qkv`` ``[B * L, (HQ + 2 HK) * D]`` (``heads`` = HQ, HK, D):
    the queries ``[B * L, HQ, D]`` after the head norm (``norms``: query
    weight, key weight, eps) and rotary embedding (``cos``/``sin``
    ``[B, L, D]``); the keys (likewise) and values written to ``caches``
    ``[slots, HK, columns, D]`` at slot ``rows[b]``, columns ``write[b, i]``."""
    hq, hk, d = heads
    tokens = qkv.shape[0]
    length = write.shape[1]
    q = torch.empty(tokens, hq, d, dtype=qkv.dtype, device=qkv.device)
    keys, values = caches
    q_weight, k_weight, eps = norms if norms is not None else (qkv, qkv, 0.0)
    _qk_rope_write_kernel[(tokens, hq + 2 * hk)](
        qkv,
        cos.contiguous(),
        sin.contiguous(),
        q_weight,
        k_weight,
        q,
        keys,
        values,
        rows,
        write.contiguous(),
        eps,
        length,
        qkv.stride(0),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        HQ=hq,
        HK=hk,
        D=d,
        HAS_NORM=norms is not None,
    )
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[rows, 2 n]`` (gate first)."""
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gate_up, y, n, BLOCK=block)
    return y


def decode_attention(
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
    limit: torch.Tensor,
    scale: float,
    width: int,
) -> torch.Tensor:
    """Attention of ``q`` ``[B * L, HQ, D]`` (row ``b``'s ``L`` new
    positions) over slot ``rows[b]`` of ``caches`` ``[slots, HK, columns, D]``:
    query ``i`` of row ``b`` sees columns ``0 .. limit[b, i]`` (``limit``
    ``[B, L]``, non-decreasing along ``i``, below ``width``). Returns
    ``[B * L, HQ, D]``. Only the columns a row sees are read."""
    keys, values = caches
    batch, length = limit.shape
    hq, d = q.shape[1], q.shape[2]
    hk = keys.shape[1]
    group = hq // hk
    block_m = max(16, triton.next_power_of_2(group * length))
    # (Two splits in the interpreter: the merge is tested, the CPU not kept busy.)
    splits = SPLITS if q.is_cuda else 2
    blocks = -(-width // (BLOCK_COLUMNS * splits))
    part_m = torch.empty(batch, hk, splits, block_m, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(batch, hk, splits, block_m, d, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _attention_split_kernel[(batch, hk, splits)](
        q,
        keys,
        values,
        rows,
        limit,
        part_acc,
        part_m,
        part_l,
        scale,
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        L=length,
        HQ=hq,
        G=group,
        D=d,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_COLUMNS,
        SPLITS=splits,
        BLOCKS=blocks,
        PRECISION=precision,
    )
    out = torch.empty_like(q)
    _attention_merge_kernel[(batch, hk)](
        part_acc,
        part_m,
        part_l,
        out,
        L=length,
        HQ=hq,
        G=group,
        D=d,
        BLOCK_M=block_m,
        SPLITS=splits,
    )
    return out
