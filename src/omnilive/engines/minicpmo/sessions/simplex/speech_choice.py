"""The speech LM's next token of every simplex answer (chat, half-duplex)
stepped in one batch, chosen together on the device.

The rule is the model code's ``TTSStreamingGenerator`` sampling
(``TTSSamplingParams`` and transformers' warpers, restated): the logits
divided by the temperature, the repetition penalty over the turn's last
:data:`~omnilive.engines.minicpmo.sessions.simplex.rules.SPEECH_PENALTY_WINDOW`
tokens (positive logits divided, negative multiplied, by ``penalty ** count``;
not on a turn's first token), top-p (the least likely tokens whose
probabilities, added up from the bottom, stay within ``1 - top_p``; the
``min_kept`` best always stay), top-k (the ``top_k`` best and every token
tied with the last of them), then a draw from the softmax of what is left at
the row's uniform number, which comes from the session's own generator.

What differs from row to row is one line of a host table, copied to the
device once per tick. On CUDA the whole choice of every row is ONE Triton
kernel (:func:`choose_chunk_fused`: a program per row sorts its row once for
top-p and top-k and draws), so a tick's speech choice costs the batch loop's
thread one copy, one launch and one read-back. :func:`choose_chunk_rows`, the
same rule as torch operations, is the CPU's path and what the kernel is held
to: each of its some thirty kernels waits for the GPU's multiprocessors
behind the lanes' work (on an H100 with 8 chats answering, 3.2 ms a tick, as
much as the per-row numpy rule before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from omnilive.engines.minicpmo.runtime.kernels import AVAILABLE, KernelChoice
from omnilive.engines.minicpmo.sessions.duplex.speech_choice import (
    COLUMNS,
    FACTORS,
    PENALISED,
    launch_per_row,
    penalty_columns,
)
from omnilive.engines.minicpmo.sessions.sampling import ANSWER_SPEECH, SpeechSampling

# The table's columns: the row's temperature, its top-p's limit (-1: no
# top-p), the sorted position its min_kept best start at, its top-k (0:
# none), its uniform number, then the penalised tokens (padded with the
# scratch column past the vocabulary) and their factors (padded with 1):
# the duplex table's layout, whose kernel's launch and first steps are shared.
TEMPERATURE, LIMIT, KEPT_FROM, CUT, UNIFORM = range(5)
KERNEL = KernelChoice("the chats' speech tokens' kernel")


class SpeechRow(NamedTuple):
    """One answer's next speech token to choose: the speech LM's ``logits``
    ``[audio tokens]``, the turn's tokens so far (None or empty for its
    first, which the model code leaves unpenalised), its sampling and
    generator."""

    logits: torch.Tensor
    previous: list[int] | None
    sampling: SpeechSampling
    generator: torch.Generator | None = None


def table_row(row: SpeechRow, size: int) -> list[float]:
    """``row``'s line of the table for logits of ``size`` tokens; it draws the
    row's uniform number from its generator."""
    sampling = row.sampling
    keep = max(sampling.top_k, sampling.min_kept)
    return [
        float(np.float32(sampling.temperature)),
        1 - sampling.top_p if sampling.top_p < 1.0 else -1.0,
        # The min_kept best always stay (a min_kept of 0 keeps all, as numpy's [-0:]).
        float(size - sampling.min_kept if sampling.min_kept else 0),
        float(keep if sampling.top_k > 0 and keep < size else 0),
        float(torch.rand(1, generator=row.generator)),
        *penalty_columns(row.previous, sampling.repetition_penalty, size),
    ]


def choose_chunk_speech_tokens(rows: Sequence[SpeechRow]) -> tuple[list[int], torch.Tensor]:
    """Each row's next speech token and the float32 scores it was drawn from
    (``[rows, audio tokens]``, ``-inf`` where top-p or top-k dropped a
    token): the kernel on CUDA, :func:`choose_chunk_rows` elsewhere."""
    logits, table = _logits_and_table(rows)
    choose = choose_chunk_fused if KERNEL.uses(logits.device) else choose_chunk_rows
    tokens, scores = choose(logits, table)
    return tokens.tolist(), scores


def _logits_and_table(rows: Sequence[SpeechRow]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' logits ``[rows, audio tokens]`` and their table (float64, on
    the logits' device); each row's uniform number drawn from its generator."""
    with torch.no_grad():
        logits = torch.stack([row.logits.detach().reshape(-1) for row in rows])
    size = int(logits.shape[1])
    lines = [table_row(row, size) for row in rows]
    return logits, torch.tensor(lines, dtype=torch.float64, device=logits.device)


def choose_chunk_speech_token(
    logits: torch.Tensor,
    previous: list[int] | None,
    sampling: SpeechSampling,
    generator: torch.Generator | None = None,
) -> tuple[int, np.ndarray]:
    """:func:`choose_chunk_speech_tokens` of one answer: its token and scores
    ``[audio tokens]`` (on the CPU)."""
    tokens, scores = choose_chunk_speech_tokens([SpeechRow(logits, previous, sampling, generator)])
    return tokens[0], scores[0].cpu().numpy()


def unfiltered_scores(rows: Sequence[SpeechRow]) -> torch.Tensor:
    """``[rows, audio tokens]``: the scores each row's choice starts from
    (tempered and penalised), before top-p and top-k drop any; the rows'
    generators are not drawn from. What the equality harness measures a
    near-tie in: a token bf16's rounding moved just out of the kept few is
    ``-inf`` in the chosen scores, yet a hair from the best."""
    # Throwaway generators: the sessions' own stay where the choice left them.
    spare = [row._replace(generator=torch.Generator()) for row in rows]
    logits, table = _logits_and_table(spare)
    table[:, LIMIT], table[:, CUT] = -1.0, 0.0
    return choose_chunk_rows(logits, table)[1]


def warm(device: torch.device, size: int, dtypes: Sequence[torch.dtype]) -> None:
    """Compile the kernel for logits of ``size`` tokens in each of ``dtypes``
    now, not at the first answer's first speech token (a second or so)."""
    for dtype in dtypes:
        row = SpeechRow(torch.zeros(size, dtype=dtype, device=device), None, ANSWER_SPEECH)
        KERNEL.warm(lambda row=row: choose_chunk_speech_tokens([row]), device)


def choose_chunk_rows(
    logits: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token from ``logits`` ``[rows, size]`` and its ``table``
    row (float64, on the logits' device): the tokens ``[rows]`` and the
    scores ``[rows, size]``. Pure tensor work, float32 up to the draw (its
    softmax and sums in float64, as the model code's numpy restatement)."""
    size, device = logits.shape[1], logits.device
    scores = logits.float() / table[:, TEMPERATURE : TEMPERATURE + 1].float()  # truly
    padded = torch.nn.functional.pad(scores, (0, 1))  # a scratch column for the padding
    index = table[:, PENALISED:FACTORS].long()
    factors = table[:, FACTORS:COLUMNS].float()
    values = padded.gather(1, index)
    padded.scatter_(1, index, torch.where(values < 0, values * factors, values / factors))
    scores = padded[:, :size]
    columns = torch.arange(size, device=device)[None, :]
    # Stable ascending order (equals by token id), what top-p adds up from.
    ascending, rising = torch.sort(scores, dim=-1, stable=True)
    wide = ascending.double()
    probability = (wide - wide[:, -1:]).exp()
    cumulative = (probability / probability.sum(-1, keepdim=True)).cumsum(-1)
    drop = cumulative <= table[:, LIMIT : LIMIT + 1]
    drop &= columns < table[:, KEPT_FROM : KEPT_FROM + 1].long()
    # Top-k's k-th best is the order's value there (where top-p dropped it,
    # what top-k would drop is gone already).
    cut = table[:, CUT : CUT + 1].long()
    at = (size - cut).clamp(max=size - 1)
    kth = torch.where(cut > 0, ascending.gather(1, at), -torch.inf)
    scores = scores.masked_fill(torch.zeros_like(drop).scatter_(1, rising, drop), -torch.inf)
    scores = scores.masked_fill(scores < kth, -torch.inf)
    finite = torch.isfinite(scores)
    wide = scores.double()
    shifted = (wide - wide.max(-1, keepdim=True).values).exp()
    cumulative = (shifted / shifted.sum(-1, keepdim=True)).cumsum(-1)
    target = table[:, UNIFORM : UNIFORM + 1] * cumulative[:, -1:]
    # The first token whose cumulative probability passes the target (a
    # dropped token adds nothing, so it is never the first), at most the
    # last token left.
    drawn = torch.searchsorted(cumulative, target, right=True).squeeze(-1)
    last = torch.where(finite, columns, -1).amax(-1)
    return torch.minimum(drawn, last), scores


def choose_chunk_fused(
    logits: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`choose_chunk_rows` as one launch of :func:`_chunk_kernel`."""
    return launch_per_row(_chunk_kernel, logits, table)


if AVAILABLE:
    import triton
    import triton.language as tl

    from omnilive.engines.minicpmo.sessions.duplex.speech_choice import penalised_row

    @triton.jit
    def _chunk_kernel(LOGITS, TABLE, TOKENS, SCORES, size, stride, BLOCK: tl.constexpr):
        # One program per row, the row's whole vocabulary in one block. The
        # table's columns as named at the module's top: TEMPERATURE 0, LIMIT
        # 1, KEPT_FROM 2, CUT 3, UNIFORM 4.
        x, row, cols, inside, t = penalised_row(LOGITS, TABLE, size, stride, BLOCK)
        # The stable ascending order as one sort of (order key, token id):
        # float32 bits made to sort as the values do (negatives' magnitude
        # bits flipped, -0 as 0), the block's padding after every token.
        bits = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        key = tl.where(inside, key, 0x7FFFFFFF)
        packed = (key.to(tl.int64) << 32) | cols.to(tl.int64)
        ordered = tl.sort(packed, 0)
        sorted_key = (ordered >> 32).to(tl.int32)
        sorted_bits = tl.where(sorted_key < 0, sorted_key ^ 0x7FFFFFFF, sorted_key)
        ascending = tl.where(inside, sorted_bits.to(tl.float32, bitcast=True), float("-inf"))
        # Top-p over that order (a row without it has a limit of -1).
        wide = ascending.to(tl.float64)
        probability = tl.exp(wide - tl.max(wide, 0))
        cumulative = tl.cumsum(probability / tl.sum(probability, 0), 0)
        kept_from = tl.load(t + 2).to(tl.int32)
        drop = (cumulative <= tl.load(t + 1)) & (cols < kept_from) & inside
        dropped = tl.sum(drop.to(tl.int32), 0)
        # A token is dropped when it comes before the first one kept in the
        # order: its (key, id) is below that one's.
        first_kept = tl.sum(tl.where(cols == dropped, ordered, 0), 0)
        x = tl.where(packed < first_kept, float("-inf"), x)
        # Top-k: the k-th best in the order (as the tensor rule's).
        cut = tl.load(t + 3).to(tl.int32)
        kth = tl.sum(tl.where(cols == size - cut, ascending, 0.0), 0)
        kth = tl.where(cut > 0, kth, float("-inf"))
        x = tl.where((x < kth) | (cols >= size), float("-inf"), x)
        tl.store(SCORES + row * size + cols, x, mask=inside)
        # The draw in token order, as the tensor rule's.
        wide = x.to(tl.float64)
        shifted = tl.exp(wide - tl.max(wide, 0))
        cumulative = tl.cumsum(shifted / tl.sum(shifted, 0), 0)
        target = tl.load(t + 4) * tl.max(cumulative, 0)
        drawn = tl.sum((inside & (cumulative <= target)).to(tl.int32), 0)
        last = tl.max(tl.where(x > float("-inf"), cols, -1), 0)
        tl.store(TOKENS + row, tl.minimum(drawn, last))
