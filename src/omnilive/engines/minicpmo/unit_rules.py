"""The decisions of one duplex unit, owned here: which token comes next, when a
unit ends, what the speech LM hears and when it stops.

These are the rules of the model's own per-unit code (``MiniCPMODuplex`` /
``DuplexCapability`` and its ``StreamDecoder``), restated over plain logits so
that one session's decisions do not depend on how its steps were batched with
other sessions'. Everything here is a pure function of logits, the session's
history and a :class:`torch.Generator` of its own (sampling draws from the
session's generator, never from the global one another session also uses).

The two published flavours of the model code differ in a few rules
(:class:`UnitRules`): the demo's unified code caps a unit's text at 28
characters and closes a spoken turn (``<|turn_eos|>``) before a forced listen.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

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
class TextSampling:
    """How the LLM's next token is chosen (the model code's ``decode``)."""

    greedy: bool = False
    temperature: float = 0.7
    top_k: int = 20
    top_p: float = 0.8
    repetition_penalty: float = 1.05
    repetition_window: int = 512
    length_penalty: float = 1.1
    listen_prob_scale: float = 1.0


@dataclass(frozen=True)
class SpeechSampling:
    """How the speech LM's next token is chosen: temperature 0 takes the most
    likely token (the model code always samples, at 0.8)."""

    temperature: float = 0.8
    repetition_penalty: float = 1.05


def choose_token(
    logits: torch.Tensor,
    history: list[int],
    sampling: TextSampling,
    vocab: DuplexVocab,
    generator: torch.Generator | None = None,
    seen: list[torch.Tensor] | None = None,
) -> int:
    """The next text token from ``logits`` ``[vocab]``; appends it to
    ``history`` (the repetition penalty's memory) unless it is the first
    look's ``<|chunk_eos|>``.

    First look: the raw distribution's choice; ``<|chunk_eos|>`` there ends
    the chunk as the model decided. Otherwise the forbidden tokens are masked,
    repeated tokens and ``<|turn_eos|>`` (length penalty) are damped, and the
    choice is made again (greedy, or temperature + top-k + top-p sampling).
    ``seen`` (if given) gets the logits the final choice was made from."""
    logits = logits.detach().float().clone()
    # Both looks' choices stay on the device until the second is made: one
    # read (a wait for the device) for the two.
    first_pick = (
        torch.argmax(logits)
        if sampling.greedy
        else torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[0]
    )
    logits[_forbidden(vocab, logits.device)] = float("-inf")
    penalty = sampling.repetition_penalty
    if penalty != 1.0 and history:
        recent = torch.tensor(sorted(set(history[-sampling.repetition_window :])))
        recent = recent[recent < logits.shape[0]]
        # Divides positive and negative logits alike, as the model code does.
        logits[recent] = (
            logits[recent] / penalty if penalty > 1.0 else logits[recent] * (1 / penalty)
        )
    if sampling.length_penalty != 1.0:
        eos = logits[vocab.turn_eos]
        logits[vocab.turn_eos] = torch.where(
            eos > 0, eos / sampling.length_penalty, eos * sampling.length_penalty
        )
    if sampling.listen_prob_scale != 1.0:
        logits[vocab.decoder_listen] *= sampling.listen_prob_scale
    seen_logits = logits.cpu() if seen is not None else None
    if sampling.greedy:
        final = torch.argmax(logits)
    else:
        filtered = top_k_top_p(logits / sampling.temperature, sampling.top_k, sampling.top_p)
        final = torch.multinomial(torch.softmax(filtered, -1), 1, generator=generator)[0]
    first, token = torch.stack([first_pick, final]).tolist()
    if first == vocab.chunk_eos:
        return first
    if seen is not None:
        seen.append(seen_logits)
    history.append(token)
    return token


@functools.lru_cache(maxsize=8)
def _forbidden(vocab: DuplexVocab, device: torch.device) -> torch.Tensor:
    """:attr:`DuplexVocab.forbidden` as an index on ``device``, made once: a
    list of the tokenizer's bad tokens turned into an index every token cost
    milliseconds of interpreter time."""
    return torch.tensor(vocab.forbidden, dtype=torch.long, device=device)


def top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits`` ``[vocab]`` with all but the ``top_k`` best and the smallest
    set of them holding ``top_p`` of the probability set to -inf (the first
    token over ``top_p`` is kept)."""
    out = logits.clone()
    if top_k > 0:
        kth = torch.topk(out, min(top_k, out.shape[-1])).values[-1]
        out[out < kth] = float("-inf")
    if top_p > 0.0:
        # Over the tokens still possible only (after top-k, about k of a
        # vocabulary of 151k): the excluded weigh nothing in the softmax and
        # sort last, so the kept set is the same; sorting the whole vocabulary
        # on the CPU would take milliseconds a token.
        alive = torch.nonzero(out > float("-inf")).flatten()
        if alive.numel() == 0:
            return out
        ordered, order = torch.sort(out[alive], descending=True)
        over = torch.cumsum(torch.softmax(ordered, -1), -1) > top_p
        over[1:] = over[:-1].clone()
        over[0] = False
        out[alive[order[over]]] = float("-inf")
    return out


def choose_speech_token(
    logits: torch.Tensor,
    previous: list[int],
    sampling: SpeechSampling,
    eos: int,
    allow_eos: bool,
    generator: torch.Generator | None = None,
    seen: list[torch.Tensor] | None = None,
) -> int:
    """The speech LM's next token from ``logits`` ``[audio tokens]``: the
    repetition penalty over this chunk's previous tokens (the last
    :data:`SPEECH_PENALTY_WINDOW`; positive logits divided, negative
    multiplied, by ``penalty ** count``), ``eos`` masked until the chunk's
    minimum, then sampled (or the best, at temperature 0); ``seen`` (if
    given) gets the logits the choice was made from."""
    logits = logits.detach().float().clone()
    if sampling.temperature > 0:
        logits = logits / sampling.temperature
    if previous and sampling.repetition_penalty != 1.0:
        window = torch.tensor(previous[-SPEECH_PENALTY_WINDOW:], device=logits.device)
        counts = torch.bincount(window, minlength=logits.shape[0])[: logits.shape[0]]
        alpha = torch.pow(torch.tensor(sampling.repetition_penalty), counts.float())
        logits = torch.where(logits < 0, logits * alpha, logits / alpha)
    if not allow_eos:
        logits[eos] = float("-inf")
    if seen is not None:
        seen.append(logits.cpu())
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
