"""The speech LM's next token of every duplex session stepped in one batch,
chosen together on the device.

The rule is the model code's (its ``StreamDecoder`` over the speech LM's
logits): the repetition penalty over the unit's last
:data:`~omnilive.engines.minicpmo.sessions.duplex.unit_rules.SPEECH_PENALTY_WINDOW`
speech tokens (positive logits divided, negative multiplied, by
``penalty ** count``), the end-of-speech token masked until the unit's
minimum, then a draw from the softmax at the session's temperature (or the
best token, at temperature 0).

What differs from session to session (temperature, the penalised tokens and
their factors, whether the end may come, a uniform number from the session's
own generator) is a row of one host table. On CUDA the whole choice of every
row is ONE Triton kernel (a program per row: the penalties, the mask, the
best token and the draw), so a tick's speech choice costs the batch loop's
thread a handful of calls and one read-back of the tokens however many
sessions speak. The numpy rule it replaced read every row back and made
some twenty numpy and torch calls a row, each letting go of the
interpreter lock that the encoders' and the vocoder's threads then held
for a while; a chain of small torch kernels instead (:func:`choose_rows`,
the CPU's path) waits for the GPU's multiprocessors once per kernel behind
those threads' work.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from omnilive.engines.minicpmo.runtime.kernels import AVAILABLE, KernelChoice
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import SPEECH_PENALTY_WINDOW
from omnilive.engines.minicpmo.sessions.sampling import DUPLEX_SPEECH, SpeechSampling

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.runtime.batch import StepResult

# The table's columns: the divisor of the logits (the temperature, 1 for the
# best token), whether the end may come, the end's token id, whether the best
# token is taken, the row's uniform number, then the penalised tokens and
# their factors (padded with the scratch column past the vocabulary, factor 1).
DIVISOR, ALLOW_EOS, EOS, GREEDY, UNIFORM, PENALISED = range(6)
FACTORS = PENALISED + SPEECH_PENALTY_WINDOW
COLUMNS = FACTORS + SPEECH_PENALTY_WINDOW


class Uniforms:
    """A session's uniform numbers, drawn from its ``generator`` ``ahead`` at a
    time: torch draws them one after another, so the sequence is the one of
    a ``torch.rand(1)`` per number, at one call per ``ahead``."""

    def __init__(self, generator: torch.Generator | None, ahead: int = 64) -> None:
        self.generator = generator
        self.size = ahead
        self.ahead: list[float] = []

    def next(self) -> float:
        if not self.ahead:
            self.ahead = torch.rand(self.size, generator=self.generator).tolist()[::-1]
        return self.ahead.pop()


class SpeechPick(NamedTuple):
    """What one session's next speech token's choice needs besides logits."""

    previous: list[int]  # the unit's speech tokens so far (the penalty's window)
    allow_eos: bool
    eos: int
    sampling: SpeechSampling
    uniforms: Uniforms
    seen: list[torch.Tensor] | None  # the logits each choice was made from (kept)


def table_row(pick: SpeechPick, size: int) -> list[float]:
    """``pick``'s row of the table (see the module's columns), for logits of
    ``size`` tokens; a sampled row takes its uniform number here."""
    sampling = pick.sampling
    sampled = sampling.temperature > 0
    uniform = pick.uniforms.next() if sampled else 0.0
    divisor = float(np.float32(sampling.temperature)) if sampled else 1.0
    head = [divisor, float(pick.allow_eos), float(pick.eos), float(not sampled), uniform]
    return [*head, *penalty_columns(pick.previous, sampling.repetition_penalty, size)]


def penalty_columns(previous: Sequence[int] | None, penalty: float, size: int) -> list[float]:
    """A table row's last columns (from :data:`PENALISED` on): the tokens of
    ``previous``'s last :data:`SPEECH_PENALTY_WINDOW` that the repetition
    ``penalty`` damps, padded with the scratch column ``size``, then their
    factors ``penalty ** count``, padded with 1. Token ids and float32
    factors are exact in float64."""
    tokens: list[float] = []
    factors: list[float] = []
    if previous and penalty != 1.0:
        base = np.float32(penalty)
        for token, count in Counter(previous[-SPEECH_PENALTY_WINDOW:]).items():
            if token < size:
                tokens.append(float(token))
                # In float32, as the model code's penalty: the same factor whatever its device.
                factors.append(float(base ** np.float32(count)))
    padding = SPEECH_PENALTY_WINDOW - len(tokens)
    return [*tokens, *[float(size)] * padding, *factors, *[1.0] * padding]


def choose_rows(logits: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token from ``logits`` ``[rows, size]`` and its ``table`` row
    (float64, on the logits' device); the tokens ``[rows]`` and the float32
    scores each was chosen from ``[rows, size]``. Pure tensor work: no value
    read back, so that a CUDA graph can hold it.

    Float32 as the model code's rule up to the draw, whose softmax and
    cumulative sum are in float64."""
    size = logits.shape[1]
    # A scratch column past the vocabulary takes the penalties' padding.
    scores = torch.nn.functional.pad(logits.float() / table[:, DIVISOR:ALLOW_EOS].float(), (0, 1))
    penalised = table[:, PENALISED:FACTORS].long()
    factors = table[:, FACTORS:COLUMNS].float()
    values = scores.gather(1, penalised)
    scores.scatter_(1, penalised, torch.where(values < 0, values * factors, values / factors))
    eos = table[:, EOS:GREEDY].long()
    allowed = table[:, ALLOW_EOS:EOS] > 0
    scores.scatter_(1, eos, torch.where(allowed, scores.gather(1, eos), float("-inf")))
    scores = scores[:, :size]
    best = scores.argmax(-1)
    wide = scores.double()
    shifted = (wide - wide.max(-1, keepdim=True).values).exp()
    cumulative = (shifted / shifted.sum(-1, keepdim=True)).cumsum(-1)
    # The inverse of the cumulative distribution at the row's uniform number.
    at = table[:, UNIFORM:PENALISED] * cumulative[:, -1:]
    drawn = torch.searchsorted(cumulative, at, right=True).squeeze(-1).clamp_(max=size - 1)
    return torch.where(table[:, GREEDY] > 0, best, drawn), scores


def choose_speech_tokens(rows: Sequence[tuple[torch.Tensor, SpeechPick]]) -> list[int]:
    """The next speech token of each row's session from its ``logits``
    ``[audio tokens]`` (all of one size, dtype and device): the kernel on
    CUDA, :func:`choose_rows` elsewhere; each row's ``seen`` (if any) gets
    the scores its choice was made from."""
    with torch.no_grad():
        logits = torch.stack([row for row, _ in rows])
    size, device = int(logits.shape[1]), logits.device
    table = [table_row(pick, size) for _, pick in rows]
    choose = choose_fused if KERNEL.uses(device) else choose_rows
    tokens, scores = choose(logits, torch.tensor(table, dtype=torch.float64, device=device))
    chosen = tokens.tolist()
    if any(pick.seen is not None for _, pick in rows):
        for (_, pick), row in zip(rows, scores.cpu(), strict=True):
            if pick.seen is not None:
                pick.seen.append(row)
    return chosen


def choose_speech_token(
    logits: torch.Tensor,
    previous: list[int],
    sampling: SpeechSampling,
    eos: int,
    allow_eos: bool,
    generator: torch.Generator | None = None,
    seen: list[torch.Tensor] | None = None,
) -> int:
    """The speech LM's next token from ``logits`` ``[audio tokens]``:
    :func:`choose_speech_tokens` of one session (one number of ``generator``)."""
    pick = SpeechPick(previous, allow_eos, eos, sampling, Uniforms(generator, 1), seen)
    return choose_speech_tokens([(logits.reshape(-1), pick)])[0]


def speech_picks(steps: list[tuple[StepResult, SpeechPick]]) -> list[int]:
    """The pick (see :mod:`~omnilive.engines.minicpmo.runtime.programs`) of
    the duplex sessions' speech tokens: every session's of a tick at once."""
    return choose_speech_tokens([(result.logits, pick) for result, pick in steps])  # type: ignore[misc]  # speech LM steps have a head: logits set


KERNEL = KernelChoice("the duplex speech tokens' kernel")


def warm(device: torch.device, size: int, dtypes: Sequence[torch.dtype]) -> None:
    """Compile the kernel for logits of ``size`` tokens in each of ``dtypes``
    now, not at the first session's first speech token (a second or so)."""
    for dtype in dtypes:
        rows = torch.zeros(1, size, dtype=dtype, device=device)
        pick = SpeechPick([], True, size - 1, DUPLEX_SPEECH, Uniforms(None, 1), None)
        KERNEL.warm(lambda rows=rows, pick=pick: choose_speech_tokens([(rows[0], pick)]), device)


def choose_fused(logits: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`choose_rows` as one launch of :func:`_choose_kernel`."""
    return launch_per_row(_choose_kernel, logits, table)


def launch_per_row(
    kernel: Any, logits: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A speech-token kernel over ``logits`` ``[rows, size]`` and a table of
    this module's layout (its first :data:`FACTORS` + window columns: the
    divisor, then four of the kernel's own, the penalised tokens and their
    factors), a program per row: the tokens ``[rows]`` and the scores."""
    rows, size = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    scores = torch.empty(rows, size, dtype=torch.float32, device=logits.device)
    block = triton.next_power_of_2(size)
    kernel[(rows,)](logits, table, tokens, scores, size, logits.stride(0), block, num_warps=16)
    return tokens, scores


if AVAILABLE:
    import triton
    import triton.language as tl

    # The table's layout inside the kernels (Triton reads globals as constexprs).
    _COLUMNS = tl.constexpr(COLUMNS)
    _PENALISED = tl.constexpr(PENALISED)
    _FACTORS = tl.constexpr(FACTORS)
    _WINDOW = tl.constexpr(SPEECH_PENALTY_WINDOW)

    @triton.jit
    def penalised_row(LOGITS, TABLE, size, stride, BLOCK: tl.constexpr):
        """The program's row of logits divided by its divisor (column 0) and
        its penalties applied; with the row's columns, which of them are
        inside the vocabulary, and its table line. The float32 divisions are
        IEEE's (div_rn: Triton's plain one is not), so every score is the
        torch rules' bit for bit."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        inside = cols < size
        t = TABLE + row * _COLUMNS
        x = tl.load(LOGITS + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
        x = tl.math.div_rn(x, tl.load(t).to(tl.float32))
        for j in tl.static_range(_WINDOW):
            token = tl.load(t + _PENALISED + j).to(tl.int32)
            factor = tl.load(t + _FACTORS + j).to(tl.float32)
            penalised = tl.where(x < 0, x * factor, tl.math.div_rn(x, factor))
            x = tl.where(cols == token, penalised, x)
        return x, row, cols, inside, t

    @triton.jit
    def _choose_kernel(LOGITS, TABLE, TOKENS, SCORES, size, stride, BLOCK: tl.constexpr):
        # One program per row, the row's whole vocabulary in one block. The
        # table's columns as named at the module's top: DIVISOR 0,
        # ALLOW_EOS 1, EOS 2, GREEDY 3, UNIFORM 4.
        x, row, cols, inside, t = penalised_row(LOGITS, TABLE, size, stride, BLOCK)
        eos = tl.load(t + 2).to(tl.int32)
        x = tl.where(cols == eos, tl.where(tl.load(t + 1) > 0, x, float("-inf")), x)
        x = tl.where(inside, x, float("-inf"))
        tl.store(SCORES + row * size + cols, x, mask=inside)
        best = tl.argmax(x, 0)  # the first of equals, as torch's and numpy's
        wide = x.to(tl.float64)
        shifted = tl.exp(wide - tl.max(wide, 0))
        cumulative = tl.cumsum(shifted / tl.sum(shifted, 0), 0)
        # Nondecreasing: its largest is its last, and the count of values at
        # most the draw's point is searchsorted's (right) index.
        at = tl.load(t + 4) * tl.max(cumulative, 0)
        drawn = tl.sum(tl.where(inside, cumulative <= at, 0).to(tl.int32), 0)
        drawn = tl.minimum(drawn, size - 1)
        tl.store(TOKENS + row, tl.where(tl.load(t + 3) > 0, best, drawn))


def speech_condition(tts: Any, spoken: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """What a unit's speech tokens are chosen after: ``[n + 1, tts hidden]``,
    each spoken token's text embedding plus its normalised projected LLM
    hidden state, then the audio BOS (``tts``: the model's speech LM)."""
    device = tts.emb_text.weight.device
    with torch.no_grad():
        bos = tts.emb_text(torch.tensor([tts.audio_bos_token_id], device=device))
        if not spoken:
            return bos
        ids = torch.tensor([t for t, _ in spoken], device=device)
        hidden = torch.stack([h.reshape(-1) for _, h in spoken]).to(device)
        projected = torch.nn.functional.normalize(tts.projector_semantic(hidden), p=2, dim=-1)
        return torch.cat([tts.emb_text(ids) + projected, bos], 0)
