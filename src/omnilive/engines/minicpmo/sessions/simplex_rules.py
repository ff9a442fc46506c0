"""The choices of a simplex answer (chat, half-duplex), owned here: which text
token comes next and which speech token, as the model's own simplex code
makes them (``ChunkPrefillChunkGenerate.chunk_generate`` and
``TTSStreamingGenerator.generate_with_buffer`` with ``gen_logits``' warpers),
restated over plain logits. Random draws come from the session's own CPU
generator, so a session's choices do not depend on which others it was
batched with.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from omnilive.engines.base import GenerationOptions
from omnilive.engines.minicpmo.sessions.unit_rules import draw, kept_count

# The punctuation the published code never lets an answer say.
FORBIDDEN_TEXT = ":：；#“”‘’@*【】「」()（）[]&/$"
TERMINATORS = ("<|tts_eos|>", "<|im_end|>", "</s>")
TOOL_CALL = "<tool_call>"  # a token of its own in the model's vocabulary
# The text repetition penalty sees this many tokens of the previous chunks
# (and every token of the running chunk).
PENALTY_WINDOW = 128
# The speech LM's repetition penalty looks at this many previous tokens.
SPEECH_PENALTY_WINDOW = 16


@dataclass(frozen=True)
class AnswerSampling:
    """How an answer's text tokens are chosen (``chunk_generate``'s arguments)."""

    greedy: bool = False
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 100
    repetition_penalty: float = 1.02
    length_penalty: float = 1.0

    @classmethod
    def of(cls, options: GenerationOptions) -> AnswerSampling:
        return cls(
            greedy=options.greedy,
            temperature=options.temperature,
            top_p=options.top_p,
            length_penalty=options.length_penalty,
        )


@dataclass(frozen=True)
class ChunkSpeechSampling:
    """How the speech LM's tokens are chosen (``TTSSamplingParams``)."""

    temperature: float = 0.8
    top_p: float = 0.85
    top_k: int = 25
    repetition_penalty: float = 1.05
    min_kept: int = 3  # the warpers never keep fewer


@dataclass(frozen=True)
class SimplexVocab:
    """The token ids an answer needs, looked up as the model code looks them up
    (a punctuation mark that is no token of its own maps to the unknown id)."""

    terminators: tuple[int, ...]
    forbidden: tuple[int, ...]
    tool_call: int | None = None  # the token that opens a function call, if the model has one

    @classmethod
    def of(cls, tokenizer: Any) -> SimplexVocab:
        """Looked up once per tokenizer (its bad tokens are thousands)."""
        return _vocab_of(tokenizer)

    @classmethod
    def _look_up(cls, tokenizer: Any) -> SimplexVocab:
        ids = tokenizer.convert_tokens_to_ids
        forbidden = [ids(token) for token in FORBIDDEN_TEXT]
        forbidden += list(getattr(tokenizer, "bad_token_ids", []) or [])
        call = ids(TOOL_CALL)
        unknown = getattr(tokenizer, "unk_token_id", None)
        return cls(
            terminators=tuple(dict.fromkeys(int(ids(t)) for t in TERMINATORS)),
            forbidden=tuple(sorted({int(t) for t in forbidden if t is not None})),
            tool_call=int(call) if call is not None and call != unknown else None,
        )


@functools.lru_cache(maxsize=4)
def _vocab_of(tokenizer: Any) -> SimplexVocab:
    return SimplexVocab._look_up(tokenizer)


@functools.lru_cache(maxsize=8)
def _index(tokens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``tokens`` as an index on ``device``, made once (not a copy to the
    device at every choice)."""
    return torch.tensor(tokens, dtype=torch.long, device=device)


class AnswerRow(NamedTuple):
    """One answer's next text token to choose: its step's ``logits``
    ``[vocab]``, the tokens its repetition penalty looks at, its sampling,
    its vocabulary, whether the forbidden punctuation is masked, its own
    generator."""

    logits: torch.Tensor
    window: list[int]
    sampling: AnswerSampling
    vocab: SimplexVocab
    suppress: bool
    generator: torch.Generator | None = None


def choose_answer_tokens(rows: Sequence[AnswerRow]) -> tuple[list[int], torch.Tensor]:
    """Each row's next text token, and the scores each was chosen from
    (``[rows, vocab]``, after the penalties, before temperature): the
    forbidden tokens masked (``suppress``), the tokens of ``window`` damped
    (repetition penalty: positive logits divided, others multiplied), the
    terminators damped likewise (length penalty); then the best, or a draw
    with temperature, top-k and top-p. Every row's penalties, best token and
    top-k in one pass over the batch and one read-back; the draws on the
    CPU over each row's few kept tokens."""
    scores = torch.stack([row.logits.detach().reshape(-1) for row in rows]).float()
    count, size = scores.shape
    device = scores.device
    for vocab in {row.vocab for row in rows if row.suppress and row.vocab.forbidden}:
        masked = [i for i, row in enumerate(rows) if row.suppress and row.vocab == vocab]
        at = torch.tensor(masked, device=device)[:, None], _index(vocab.forbidden, device)[None, :]
        scores[at] = float("-inf")
    padded = torch.nn.functional.pad(scores, (0, 1))  # a scratch column for short rows
    repeated = [
        sorted(set(row.window)) if row.sampling.repetition_penalty != 1.0 else [] for row in rows
    ]
    _damp_rows(padded, repeated, [row.sampling.repetition_penalty for row in rows])
    ends = [
        list(row.vocab.terminators) if row.sampling.length_penalty != 1.0 else [] for row in rows
    ]
    _damp_rows(padded, ends, [row.sampling.length_penalty for row in rows])
    scores = padded[:, :size]
    sampled = [i for i, row in enumerate(rows) if not row.sampling.greedy]
    keeps = [_top_k(rows[i].sampling.top_k, size) for i in sampled]
    best = scores.argmax(-1).double()
    if not sampled:
        return [int(token) for token in best.tolist()], scores
    temperatures = [rows[i].sampling.temperature for i in sampled]
    scaled = _divided(scores[torch.tensor(sampled, device=device)], temperatures)
    values, index = torch.topk(scaled, max(keeps))
    host = torch.cat([best, values.double().reshape(-1), index.double().reshape(-1)]).cpu()
    tokens = [int(token) for token in host[:count].tolist()]
    values_at, index_at = host[count:].reshape(2, len(sampled), -1).numpy()
    for k, (i, keep) in enumerate(zip(sampled, keeps, strict=True)):
        row = rows[i]
        # Equal scores by token id, so that a row's draw does not depend on
        # the other rows (top-k's order of equals may change with the batch).
        order = np.lexsort((index_at[k], -values_at[k]))[:keep]
        ordered = values_at[k, order].astype(np.float32)
        top_p = row.sampling.top_p if row.sampling.top_p < 1.0 else 0.0
        kept = kept_count(ordered, 0, top_p)
        tokens[i] = int(index_at[k, order[draw(ordered[:kept], row.generator)]])
    return tokens, scores


def choose_answer_token(
    logits: torch.Tensor,
    window: list[int],
    sampling: AnswerSampling,
    vocab: SimplexVocab,
    suppress: bool,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """:func:`choose_answer_tokens` of one answer: its token and scores ``[vocab]``."""
    tokens, scores = choose_answer_tokens(
        [AnswerRow(logits, window, sampling, vocab, suppress, generator)]
    )
    return tokens[0], scores[0]


def _top_k(top_k: int, size: int) -> int:
    return min(top_k, size) if top_k > 0 else size


def _divided(scores: torch.Tensor, by: Sequence[float]) -> torch.Tensor:
    """Each row of ``scores`` divided by its number of ``by`` as torch divides
    a float32 tensor by a Python number (what the per-row rule, and the
    model code, do): on CUDA by multiplying with the number's float32
    reciprocal, on the CPU truly."""
    if scores.is_cuda:
        inverse = [float(np.float32(1.0) / np.float32(value)) for value in by]
        return scores * torch.tensor(inverse, dtype=torch.float32, device=scores.device)[:, None]
    return scores / torch.tensor(by, dtype=torch.float32)[:, None]


def _damp_rows(padded: torch.Tensor, at: list[list[int]], penalties: list[float]) -> None:
    """In each row of ``padded`` (the scores and a scratch column), the
    positive scores at its tokens of ``at`` divided by its penalty, the
    others multiplied."""
    width = max(map(len, at))
    if not width:
        return
    scratch = padded.shape[1] - 1
    index = torch.tensor([tokens + [scratch] * (width - len(tokens)) for tokens in at])
    index = index.to(padded.device)
    values = padded.gather(1, index)
    factors = torch.tensor(penalties, dtype=torch.float32, device=padded.device)[:, None]
    damped = torch.where(values > 0, _divided(values, penalties), values * factors)
    padded.scatter_(1, index, damped)


class SpeechRow(NamedTuple):
    """One answer's next speech token to choose: the speech LM's ``logits``
    ``[audio tokens]``, the turn's tokens so far (None or empty for its
    first, which the model code leaves unpenalised), its sampling and
    generator."""

    logits: torch.Tensor
    previous: list[int] | None
    sampling: ChunkSpeechSampling
    generator: torch.Generator | None = None


def choose_chunk_speech_tokens(rows: Sequence[SpeechRow]) -> tuple[list[int], torch.Tensor]:
    """Each row's next speech token and the scores it was drawn from
    (``[rows, audio tokens]``): temperature, then the repetition penalty over
    the last :data:`SPEECH_PENALTY_WINDOW` of ``previous``, then top-p and
    top-k (each keeping at least ``min_kept``, top-k keeping ties), then a
    draw at the row's uniform number. Every row at once on the logits'
    device, float32 up to the draw (its softmax and sums in float64), one
    read-back of the tokens: the per-row numpy rule it replaced read every
    row back and let go of the interpreter lock some twenty times a row."""
    logits = torch.stack([row.logits.detach().reshape(-1) for row in rows]).float()
    size, device = logits.shape[1], logits.device

    def column(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)[:, None]

    scores = logits / column([row.sampling.temperature for row in rows])
    penalised, factors = [], []
    for row in rows:
        tokens, alphas = [], []
        penalty = np.float32(row.sampling.repetition_penalty)
        if row.previous and penalty != 1.0:
            for token, times in Counter(row.previous[-SPEECH_PENALTY_WINDOW:]).items():
                if token < size:
                    tokens.append(token)
                    alphas.append(float(penalty ** np.float32(times)))
        padding = SPEECH_PENALTY_WINDOW - len(tokens)
        penalised.append(tokens + [size] * padding)
        factors.append(alphas + [1.0] * padding)
    padded = torch.nn.functional.pad(scores, (0, 1))
    index = torch.tensor(penalised, device=device)
    alpha = torch.tensor(factors, dtype=torch.float32, device=device)
    values = padded.gather(1, index)
    padded.scatter_(1, index, torch.where(values < 0, values * alpha, values / alpha))
    scores = padded[:, :size]
    columns = torch.arange(size, device=device)[None, :]
    limits = [1 - row.sampling.top_p if row.sampling.top_p < 1.0 else -1.0 for row in rows]
    if max(limits) >= 0:
        ascending, rising = torch.sort(scores, dim=-1, stable=True)
        wide = ascending.double()
        probability = (wide - wide[:, -1:]).exp()
        cumulative = (probability / probability.sum(-1, keepdim=True)).cumsum(-1)
        drop = cumulative <= column(limits, torch.float64)
        # The min_kept best always stay (a min_kept of 0 keeps all, as numpy's [-0:]).
        kept_from = [size - row.sampling.min_kept if row.sampling.min_kept else 0 for row in rows]
        drop &= columns < column(kept_from, torch.long)
        scores = scores.masked_fill(torch.zeros_like(drop).scatter_(1, rising, drop), -torch.inf)
    keeps = [max(row.sampling.top_k, row.sampling.min_kept) for row in rows]
    cut = [
        keep if row.sampling.top_k > 0 and keep < size else 0
        for keep, row in zip(keeps, rows, strict=True)
    ]
    if any(cut):
        ranked = torch.topk(scores, max(cut)).values
        kth = ranked.gather(1, column([max(k, 1) - 1 for k in cut], torch.long))
        kth = torch.where(column(cut, torch.long) > 0, kth, -torch.inf)
        scores = scores.masked_fill(scores < kth, -torch.inf)
    finite = torch.isfinite(scores)
    wide = scores.double()
    shifted = (wide - wide.max(-1, keepdim=True).values).exp()
    cumulative = (shifted / shifted.sum(-1, keepdim=True)).cumsum(-1)
    uniforms = [float(torch.rand(1, generator=row.generator)) for row in rows]
    at = column(uniforms, torch.float64) * cumulative[:, -1:]
    drawn = torch.searchsorted(cumulative, at, right=True).squeeze(-1)
    last = torch.where(finite, columns, -1).amax(-1)  # the last token a draw may reach
    return [int(token) for token in torch.minimum(drawn, last).tolist()], scores


def choose_chunk_speech_token(
    logits: torch.Tensor,
    previous: list[int] | None,
    sampling: ChunkSpeechSampling,
    generator: torch.Generator | None = None,
) -> tuple[int, np.ndarray]:
    """:func:`choose_chunk_speech_tokens` of one answer: its token and scores
    ``[audio tokens]`` (on the CPU)."""
    tokens, scores = choose_chunk_speech_tokens([SpeechRow(logits, previous, sampling, generator)])
    return tokens[0], scores[0].cpu().numpy()
