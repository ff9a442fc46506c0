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
from dataclasses import dataclass
from typing import Any

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


def choose_answer_token(
    logits: torch.Tensor,
    window: list[int],
    sampling: AnswerSampling,
    vocab: SimplexVocab,
    suppress: bool,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """The next text token from ``logits`` ``[vocab]`` and the logits it was
    chosen from (after the penalties, before temperature): the forbidden
    tokens masked (``suppress``), the tokens of ``window`` damped
    (repetition penalty: positive logits divided, others multiplied), the
    terminators damped likewise (length penalty); then the best, or a draw
    with temperature, top-k and top-p."""
    scores = logits.detach().reshape(-1).float().clone()
    device = scores.device
    if suppress and vocab.forbidden:
        scores[_index(vocab.forbidden, device)] = float("-inf")
    if window and sampling.repetition_penalty != 1.0:
        _damp(scores, torch.tensor(sorted(set(window)), device=device), sampling.repetition_penalty)
    if sampling.length_penalty != 1.0:
        _damp(scores, _index(vocab.terminators, device), sampling.length_penalty)
    if sampling.greedy:
        return int(scores.argmax()), scores
    scaled = scores / sampling.temperature if sampling.temperature != 1.0 else scores
    size = scaled.shape[0]
    keep = min(sampling.top_k, size) if sampling.top_k > 0 else size
    values, index = torch.topk(scaled, keep)
    ordered, ids = values.cpu().numpy(), index.cpu().numpy()
    top_p = sampling.top_p if sampling.top_p < 1.0 else 0.0
    kept = kept_count(ordered, 0, top_p)
    return int(ids[draw(ordered[:kept], generator)]), scores


def _damp(scores: torch.Tensor, at: torch.Tensor, penalty: float) -> None:
    """Positive scores at ``at`` divided by ``penalty``, the others multiplied."""
    values = scores[at]
    scores[at] = torch.where(values > 0, values / penalty, values * penalty)


def choose_chunk_speech_token(
    logits: torch.Tensor,
    previous: list[int] | None,
    sampling: ChunkSpeechSampling,
    generator: torch.Generator | None = None,
) -> tuple[int, np.ndarray]:
    """The speech LM's next token from ``logits`` ``[audio tokens]`` and the
    scores it was drawn from: temperature, then the repetition penalty over
    the last :data:`SPEECH_PENALTY_WINDOW` of ``previous`` (the turn's tokens
    so far; None for the turn's first token, which the model code leaves
    alone), then top-p and top-k (each keeping at least ``min_kept``, top-k
    keeping ties), then a draw. On the CPU, over numpy: one row of a few
    thousand logits."""
    scores = logits.detach().reshape(-1).float().cpu().numpy().copy()
    scores /= np.float32(sampling.temperature)
    if previous and sampling.repetition_penalty != 1.0:
        penalty = np.float32(sampling.repetition_penalty)
        for token, count in Counter(previous[-SPEECH_PENALTY_WINDOW:]).items():
            alpha = penalty ** np.float32(count)
            value = scores[token]
            scores[token] = value * alpha if value < 0 else value / alpha
    if sampling.top_p < 1.0:
        rising = np.argsort(scores, kind="stable")
        probability = np.exp(scores[rising].astype(np.float64) - scores.max())
        cumulative = np.cumsum(probability / probability.sum())
        drop = cumulative <= 1 - sampling.top_p
        drop[-sampling.min_kept :] = False
        scores[rising[drop]] = -np.inf
    if sampling.top_k > 0:
        keep = max(sampling.top_k, sampling.min_kept)
        if keep < len(scores):
            kth = np.partition(scores, len(scores) - keep)[len(scores) - keep]
            scores[scores < kth] = -np.inf
    finite = np.flatnonzero(np.isfinite(scores))
    return int(finite[draw(scores[finite], generator)]), scores
