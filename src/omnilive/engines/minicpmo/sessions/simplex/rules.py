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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from omnilive.engines.minicpmo.sessions.duplex.unit_rules import draw, kept_count
from omnilive.engines.minicpmo.sessions.sampling import TextSampling

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
    sampling: TextSampling
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
    top-k at once on the logits' device, from one table copied there and
    one read-back (each copy and read-back lets go of the interpreter lock,
    which the lanes' threads then hold for a while); the draws on the CPU
    over each row's few kept tokens."""
    scores = torch.stack([row.logits.detach().reshape(-1) for row in rows]).float()
    size, device = scores.shape[1], scores.device
    windows = [
        sorted(set(row.window)) if row.sampling.repetition_penalty != 1.0 else [] for row in rows
    ]
    ends = [
        list(row.vocab.terminators) if row.sampling.length_penalty != 1.0 else [] for row in rows
    ]
    wide, ending = max(map(len, windows), default=0), max(map(len, ends), default=0)
    # Columns: suppress; the repetition and length penalties' factors and
    # divisors, the temperature's divisor (as the device divides by a Python
    # number, see _divisor); the window's tokens; the terminators.
    table = [
        [
            float(row.suppress),
            *_penalty(row.sampling.repetition_penalty, scores.is_cuda),
            *_penalty(row.sampling.length_penalty, scores.is_cuda),
            _divisor(row.sampling.temperature, scores.is_cuda),
            *_padded(window, wide, size),
            *_padded(end, ending, size),
        ]
        for row, window, end in zip(rows, windows, ends, strict=True)
    ]
    on = torch.tensor(table, dtype=torch.float64, device=device)
    vocabs = {row.vocab for row in rows}
    for vocab in {row.vocab for row in rows if row.suppress and row.vocab.forbidden}:
        forbidden = _index(vocab.forbidden, device)
        masked = on[:, :1] > 0
        if len(vocabs) > 1:  # rows of other vocabularies left alone
            mine = [row.vocab == vocab for row in rows]
            masked = masked & torch.tensor(mine, device=device)[:, None]
        scores[:, forbidden] = scores[:, forbidden].masked_fill(masked, float("-inf"))
    padded = torch.nn.functional.pad(scores, (0, 1))  # a scratch column for short rows
    _damp_rows(padded, on[:, 6 : 6 + wide], on[:, 1:3])
    _damp_rows(padded, on[:, 6 + wide :], on[:, 3:5])
    scores = padded[:, :size]
    sampled = [i for i, row in enumerate(rows) if not row.sampling.greedy]
    best = scores.argmax(-1).double()
    if not sampled:
        return [int(token) for token in best.tolist()], scores
    keeps = [_top_k(row.sampling.top_k, size) for row in rows]
    values, index = torch.topk(_divide(scores, on[:, 5:6]), max(keeps[i] for i in sampled))
    count = len(rows)
    host = torch.cat([best, values.double().reshape(-1), index.double().reshape(-1)]).cpu()
    tokens = [int(token) for token in host[:count].tolist()]
    values_at, index_at = host[count:].reshape(2, count, -1).numpy()
    for i in sampled:
        row = rows[i]
        # Equal scores by token id, so that a row's draw does not depend on
        # the other rows (top-k's order of equals may change with the batch).
        order = np.lexsort((index_at[i], -values_at[i]))[: keeps[i]]
        ordered = values_at[i, order].astype(np.float32)
        top_p = row.sampling.top_p if row.sampling.top_p < 1.0 else 0.0
        kept = kept_count(ordered, 0, top_p)
        tokens[i] = int(index_at[i, order[draw(ordered[:kept], row.generator)]])
    return tokens, scores


def choose_answer_token(
    logits: torch.Tensor,
    window: list[int],
    sampling: TextSampling,
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


def _divisor(number: float, cuda: bool) -> float:
    """What :func:`_divide` takes to divide as torch divides a float32 tensor
    by the Python ``number`` (as the model code and the per-row rule did):
    on CUDA torch multiplies by the number's float32 reciprocal, which can
    differ from a true division in the last bit; on the CPU it divides."""
    if cuda:
        return float(np.float32(1.0) / np.float32(number))
    return float(np.float32(number))


def _divide(scores: torch.Tensor, divisors: torch.Tensor) -> torch.Tensor:
    """``scores`` divided by a column of :func:`_divisor` s (float64 holding float32s)."""
    if scores.is_cuda:
        return scores * divisors.float()
    return scores / divisors.float()


def _penalty(penalty: float, cuda: bool) -> tuple[float, float]:
    """A penalty's factor (for negative scores) and divisor (for positive)."""
    return float(np.float32(penalty)), _divisor(penalty, cuda)


def _padded(tokens: list[int], width: int, scratch: int) -> list[float]:
    return [*map(float, tokens), *[float(scratch)] * (width - len(tokens))]


def _damp_rows(padded: torch.Tensor, at: torch.Tensor, penalties: torch.Tensor) -> None:
    """In each row of ``padded`` (the scores and a scratch column), the
    positive scores at its tokens ``at`` divided by its penalty, the others
    multiplied (``penalties``: each row's factor and divisor)."""
    if not at.shape[1]:
        return
    index = at.long()
    values = padded.gather(1, index)
    damped = torch.where(
        values > 0, _divide(values, penalties[:, 1:2]), values * penalties[:, :1].float()
    )
    padded.scatter_(1, index, damped)
