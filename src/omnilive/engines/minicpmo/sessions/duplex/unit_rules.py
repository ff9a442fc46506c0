"""The decisions of one duplex unit, owned here: which token comes next, when a
unit ends, what the speech LM hears and when it stops.

These are the rules of the model's own per-unit code (``MiniCPMODuplex`` /
``DuplexCapability`` and its ``StreamDecoder``), restated over plain logits so
that one session's decisions do not depend on how its steps were batched with
other sessions'. Everything here is a pure function of logits, the session's
history and a :class:`torch.Generator` of its own (sampling draws from the
session's generator, never from the global one another session also uses).
The speech LM's token is chosen by
:mod:`~omnilive.engines.minicpmo.sessions.duplex.speech_choice`, on the device.

The two published flavours of the model code differ in a few rules
(:class:`UnitRules`): the demo's unified code caps a unit's text at 28
characters and closes a spoken turn (``<|turn_eos|>``) before a forced listen.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from omnilive.engines.minicpmo.sessions.sampling import TextSampling

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.runtime.batch import StepResult

# The speech LM's vocabulary ends with its end-of-speech token; this token id is
# the vocoder's silence (the model code primes each turn's buffer with three).
SILENCE_TOKEN = 4218
# A unit's speech: up to 25 tokens (one second at 25 Hz), one more decided
# and dropped (the model code's ``25 + 1``).
SPEECH_TOKENS_PER_UNIT = 26
# The speech LM's repetition penalty looks at this many previous tokens.
SPEECH_PENALTY_WINDOW = 16


@dataclass(frozen=True)
class DuplexVocab:
    """The special tokens of the duplex format, looked up in the tokenizer."""

    unit: int
    unit_end: int
    image_start: int
    image_end: int
    slice_start: int
    slice_end: int
    listen: int
    speak: int
    tts_bos: int
    chunk_eos: int
    chunk_tts_eos: int
    turn_eos: int
    tts_pad: int
    # The decoder's "listen" for listen_prob_scale: the tokenizer's eos token,
    # as the model code has it (not always ``<|listen|>``).
    decoder_listen: int
    bad: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer: Any) -> DuplexVocab:
        ids = tokenizer.convert_tokens_to_ids
        return cls(
            unit=ids("<unit>"),
            unit_end=ids("</unit>"),
            image_start=ids("<image>"),
            image_end=ids("</image>"),
            slice_start=ids("<slice>"),
            slice_end=ids("</slice>"),
            listen=ids("<|listen|>"),
            speak=ids("<|speak|>"),
            tts_bos=ids("<|tts_bos|>"),
            chunk_eos=ids("<|chunk_eos|>"),
            chunk_tts_eos=ids("<|chunk_tts_eos|>"),
            turn_eos=ids("<|turn_eos|>"),
            tts_pad=ids("<|tts_pad|>"),
            decoder_listen=int(tokenizer.eos_token_id),
            bad=tuple(int(t) for t in getattr(tokenizer, "bad_token_ids", []) or []),
        )

    @property
    def terminators(self) -> frozenset[int]:
        """Tokens that end a unit's text (and are fed with ``</unit>``)."""
        return frozenset((self.listen, self.chunk_eos, self.chunk_tts_eos))

    @property
    def forbidden(self) -> tuple[int, ...]:
        """Never chosen once the first look (see :func:`choose_token`) passed:
        ``<|tts_pad|>``, the tokenizer's bad tokens, and ``<|chunk_eos|>``."""
        return (self.tts_pad, *self.bad, self.chunk_eos)


@dataclass(frozen=True)
class UnitRules:
    """Where the two flavours of the model's code differ."""

    # A unit's text is cut (``<|chunk_eos|>`` instead of the token that would
    # make it this long, in characters); None: no cap.
    char_limit: int | None = None
    # A forced listen in the middle of a spoken turn feeds ``<|turn_eos|>``
    # first and starts the next turn's voice afresh.
    close_turn_on_forced_listen: bool = False
    # The vocoder voices everything it can after every unit, not only at a
    # turn's start (where it may voice less than a second).
    always_flush: bool = False

    @classmethod
    def unified(cls) -> UnitRules:
        return cls(char_limit=28, close_turn_on_forced_listen=True, always_flush=True)


@dataclass(frozen=True)
class TextChoice:
    """What a text token's choice needs besides its logits: the session's
    repetition history (appended to), its sampling, its vocabulary, its
    generator (a CPU one; None: torch's default) and, if kept, where the
    logits the final choice was made from go."""

    history: list[int]
    sampling: TextSampling
    vocab: DuplexVocab
    generator: torch.Generator | None = None
    seen: list[torch.Tensor] | None = None


# A batched choice reads back each row's best top_k + this many tokens: all
# that top-k keeps, ties with its last included (a row with more ties than
# that is chosen again from its whole row).
TOP_K_MARGIN = 16


def choose_token(
    logits: torch.Tensor,
    history: list[int],
    sampling: TextSampling,
    vocab: DuplexVocab,
    generator: torch.Generator | None = None,
    seen: list[torch.Tensor] | None = None,
) -> int:
    """The next text token from ``logits`` ``[vocab]``: :func:`choose_tokens`
    of one session."""
    return choose_tokens([(logits, TextChoice(history, sampling, vocab, generator, seen))])[0]


def choose_tokens(rows: Sequence[tuple[torch.Tensor, TextChoice]]) -> list[int]:
    """The next text token of each row's session from its ``logits``
    ``[vocab]``; each token is appended to its session's history unless it
    is the first look's ``<|chunk_eos|>``.

    First look: the raw distribution's choice; ``<|chunk_eos|>`` there ends
    the chunk as the model decided. Otherwise the forbidden tokens are masked,
    repeated tokens and ``<|turn_eos|>`` (length penalty) are damped, and the
    choice is made again (greedy, or temperature + top-k + top-p sampling).

    Rows of one sampling and vocabulary are worked on together, as one
    matrix, and read back once; every random draw comes from the row's own
    generator, on the CPU, so a session's choices do not depend on which
    others it was batched with."""
    tokens = [0] * len(rows)
    groups: dict[tuple[TextSampling, DuplexVocab, torch.device], list[int]] = {}
    for index, (logits, choice) in enumerate(rows):
        groups.setdefault((choice.sampling, choice.vocab, logits.device), []).append(index)
    for members in groups.values():
        chosen = _choose_together([rows[index] for index in members])
        for index, token in zip(members, chosen, strict=True):
            tokens[index] = token
    return tokens


def _choose_together(rows: Sequence[tuple[torch.Tensor, TextChoice]]) -> list[int]:
    """:func:`choose_tokens` over rows of one sampling and vocabulary."""
    choices = [choice for _, choice in rows]
    sampling, vocab = choices[0].sampling, choices[0].vocab
    logits = torch.stack([row.detach().reshape(-1) for row, _ in rows]).float()
    size, device = logits.shape[1], logits.device
    first_pick = logits.argmax(-1) if sampling.greedy else _draw_rows(logits, choices)
    logits[:, _forbidden(vocab, device)] = float("-inf")
    penalty = sampling.repetition_penalty
    if penalty != 1.0:
        rows_at, tokens_at = [], []
        for b, choice in enumerate(choices):
            recent = sorted(set(choice.history[-sampling.repetition_window :]))
            tokens_at += [token for token in recent if token < size]
            rows_at += [b] * (len(tokens_at) - len(rows_at))
        if tokens_at:
            at = (torch.tensor(rows_at, device=device), torch.tensor(tokens_at, device=device))
            # Divides positive and negative logits alike, as the model code does.
            logits[at] = logits[at] / penalty if penalty > 1.0 else logits[at] * (1 / penalty)
    if sampling.length_penalty != 1.0:
        eos = logits[:, vocab.turn_eos]
        logits[:, vocab.turn_eos] = torch.where(
            eos > 0, eos / sampling.length_penalty, eos * sampling.length_penalty
        )
    if sampling.listen_prob_scale != 1.0:
        logits[:, vocab.decoder_listen] *= sampling.listen_prob_scale
    kept = logits.cpu() if any(choice.seen is not None for choice in choices) else None
    if sampling.greedy:
        picks = torch.stack([first_pick, logits.argmax(-1)], 1).tolist()
        finals = [final for _, final in picks]
    else:
        picks, finals = _sample(logits / sampling.temperature, first_pick, choices)
    tokens = []
    for b, (choice, (first, *_), final) in enumerate(zip(choices, picks, finals, strict=True)):
        if int(first) == vocab.chunk_eos:
            tokens.append(vocab.chunk_eos)
            continue
        if choice.seen is not None and kept is not None:
            choice.seen.append(kept[b])
        choice.history.append(final)
        tokens.append(final)
    return tokens


def _draw_rows(logits: torch.Tensor, choices: Sequence[TextChoice]) -> torch.Tensor:
    """A token of each row drawn from its softmax, by the inverse of its
    cumulative distribution at a uniform number of the row's generator."""
    uniform = torch.cat([torch.rand(1, generator=choice.generator) for choice in choices])
    cumulative = torch.softmax(logits, -1).cumsum_(-1)
    at = uniform.to(logits.device)[:, None] * cumulative[:, -1:]
    drawn = torch.searchsorted(cumulative, at.contiguous()).squeeze(-1)
    return drawn.clamp_(max=logits.shape[1] - 1)


def _sample(
    scaled: torch.Tensor, first_pick: torch.Tensor, choices: Sequence[TextChoice]
) -> tuple[list[list[float]], list[int]]:
    """Each row's first look and its top-k + top-p draw from ``scaled``
    logits: the best tokens of every row read back at once, the draw made
    on the CPU over them."""
    sampling = choices[0].sampling
    size = scaled.shape[1]
    # Without top-k every token may be kept: all of each row is read, in order.
    window = size if sampling.top_k <= 0 else min(size, sampling.top_k + TOP_K_MARGIN)
    values, index = torch.topk(scaled, window, -1)
    kth = values[:, min(max(sampling.top_k, 1), window) - 1 :][:, :1]
    ties = (scaled >= kth).sum(-1)  # how many tokens top-k keeps
    head = torch.stack([first_pick, ties], 1).float()
    read = torch.cat([head, values, index.float()], 1).cpu().numpy()  # ids < 2**24: exact
    picks, finals = read[:, :2].tolist(), []
    for b, choice in enumerate(choices):
        ordered, ids = read[b, 2 : 2 + window], read[b, 2 + window :]
        if picks[b][1] > window:  # more tied with top-k's last than were read
            row = scaled[b].cpu().numpy()
            ids = np.argsort(-row, kind="stable")
            ordered = row[ids]
        kept = kept_count(ordered, sampling.top_k, sampling.top_p)
        finals.append(int(ids[draw(ordered[:kept], choice.generator)]))
    return picks, finals


@functools.lru_cache(maxsize=8)
def _forbidden(vocab: DuplexVocab, device: torch.device) -> torch.Tensor:
    """:attr:`DuplexVocab.forbidden` as an index on ``device``, made once: a
    list of the tokenizer's bad tokens turned into an index every token cost
    milliseconds of interpreter time."""
    return torch.tensor(vocab.forbidden, dtype=torch.long, device=device)


def kept_count(ordered: np.ndarray, top_k: int, top_p: float) -> int:
    """How many of ``ordered`` (logits, best first) top-k and top-p keep:
    the ``top_k`` best and every token tied with the last of them (0: no
    top-k), then the fewest of those holding ``top_p`` of their probability,
    the token that crosses it included (0: no top-p). Never an impossible
    (-inf) token, never none."""
    kept = int(np.isfinite(ordered).sum())
    if top_k > 0 and kept > top_k:
        kept = int(np.searchsorted(-ordered[:kept], -ordered[top_k - 1], side="right"))
    if top_p > 0.0 and kept > 1:
        over = np.cumsum(_softmax(ordered[:kept])) > top_p
        if over.any():
            kept = int(np.argmax(over)) + 1
    return max(kept, 1)


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores.astype(np.float64) - scores.max())
    return shifted / shifted.sum()


def draw(scores: np.ndarray, generator: torch.Generator | None) -> int:
    """An index drawn from ``softmax(scores)``: the inverse of the cumulative
    distribution at a uniform number of ``generator`` (the session's own)."""
    cumulative = np.cumsum(_softmax(scores))
    uniform = float(torch.rand(1, generator=generator)) * cumulative[-1]
    return min(int(np.searchsorted(cumulative, uniform, side="right")), len(scores) - 1)


# --- the picks of a unit's programs (runtime/programs.py): the tokens of
# every session stepped in one batch, chosen together after it


def text_picks(steps: list[tuple[StepResult, TextChoice]]) -> list[int]:
    """The next text token of every session whose step of this tick named
    this pick, chosen together (:func:`choose_tokens`); the speech tokens'
    are :mod:`~omnilive.engines.minicpmo.sessions.duplex.speech_choice`'s."""
    return choose_tokens([(result.logits, choice) for result, choice in steps])


# --- a unit's outcome -------------------------------------------------------------


NOTHING_FED = {"slices": 0, "vision": 0, "audio": 0}


class Decided(NamedTuple):
    """A unit's program's outcome: what was fed, the decisions (None: its
    logits wait for generate) and whether its voice flushes."""

    fed: dict[str, int]
    outcome: UnitOutcome | None
    flush: bool


@dataclass
class UnitOutcome:
    """One unit's decision and output (the engine's DuplexUnit is built from it)."""

    is_listen: bool
    # Every token the unit decided, in order: the first (a turn's
    # ``<|speak|>``/``<|tts_bos|>``/...), the text, the terminator.
    decided: list[int]
    text_tokens: list[int]
    text: str
    speech_tokens: list[int]
    audio: np.ndarray | None
    end_of_turn: bool
    kv_length: int
    # Logits the decisions were made from, one per text step (for the
    # equality harness; kept only when asked for).
    logits: list[torch.Tensor] = field(default_factory=list)
    # Wall clock of the unit's parts, queueing for the batch loop included.
    llm_ms: float = 0.0
    speech_ms: float = 0.0
    vocoder_ms: float = 0.0
