"""The speech LM's side of a simplex answer in a slot, as the model code's
``TTSStreamingGenerator`` makes it: each text chunk's tokens and hidden
states condition the speech LM (its ``sliding_recompute`` context), its
tokens are chosen together with the other answers' (:func:`speech_picks`)
and handed out in :class:`Piece` s for the vocoder."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from omnilive.engines.base import EngineError
from omnilive.engines.minicpmo.runtime.batch import StepResult
from omnilive.engines.minicpmo.runtime.programs import Pick, Program, Step
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import SILENCE_TOKEN
from omnilive.engines.minicpmo.sessions.simplex.speech_choice import (
    SpeechRow,
    choose_chunk_speech_tokens,
    unfiltered_scores,
)
from omnilive.engines.minicpmo.sessions.voice.flow import BATCH_BUCKETS
from omnilive.engines.minicpmo.sessions.voice.vocoder import VOCODER_CHUNK, voice_together

if TYPE_CHECKING:
    import numpy as np

    from omnilive.engines.minicpmo.sessions.shared import SharedModel

log = logging.getLogger(__name__)

# Speech tokens of an answer's first piece: 0.4 s of audio (with the three
# silent tokens the vocoder starts a turn with), out about 50 ms before a
# whole second would be, and long enough to play while the next is made.
FIRST_PIECE = 10


@dataclass
class Piece:
    """What an answer program hands out between its steps: how many text
    tokens it fed so far, speech tokens for the vocoder (``flush``: voiced
    now, all but the lookahead), whether it ends (``stopped``: interrupted,
    nothing more to voice)."""

    text_tokens: int
    speech: list[int] = field(default_factory=list)
    last: bool = False
    flush: bool = False
    stopped: bool = False


class SpeechChoice(NamedTuple):
    session: Any  # the SlotSimplex answering
    previous: list[int]


class SpeechTurn:
    """The speech LM's side of one answer (``TTSStreamingGenerator``): its
    tokens so far, the ones not handed to the vocoder yet, the previous
    chunk's condition and speech (what ``sliding_recompute`` feeds again)."""

    def __init__(self, session: Any) -> None:  # the SlotSimplex answering
        self.session = session
        tts = session.shared.model.tts
        self.tts = tts
        self.eos = int(tts.config.num_audio_tokens) - 1
        self.recompute = getattr(tts, "attention_type", "") == "sliding_recompute"
        self.tokens: list[int] = []
        self.buffer: list[int] = []
        self.handed = False  # whether the first piece went to the vocoder
        self.previous: torch.Tensor | None = None  # the previous chunk's inputs to feed again
        device = tts.emb_text.weight.device
        bos, eos = tts.audio_bos_token_id, tts.config.text_eos_token_id
        with torch.no_grad():
            self.audio_bos = tts.emb_text(torch.tensor([bos], device=device))
            self.text_eos = tts.emb_text(torch.tensor([eos], device=device))
        cache = session.loop.speech.cache
        cache.crop(session.slot, 0)  # a program owns its slot's caches
        self.cache = cache

    def condition(self, fed: list[tuple[int, torch.Tensor]], finished: bool) -> torch.Tensor:
        """``[n + 1 (+ 1), tts hidden]``: each fed token's text embedding plus
        its normalised projected hidden state, the text's end if it ended,
        the audio BOS."""
        tts = self.tts
        device = tts.emb_text.weight.device
        with torch.no_grad():
            ids = torch.tensor([t for t, _ in fed], device=device)
            hidden = torch.stack([h.reshape(-1) for _, h in fed]).to(device)
            projected = tts.projector_semantic(hidden)
            if tts.config.normalize_projected_hidden:
                projected = torch.nn.functional.normalize(projected, p=2, dim=-1)
            parts = [tts.emb_text(ids) + projected]
            if finished:
                parts.append(self.text_eos)
            return torch.cat([*parts, self.audio_bos], 0)

    def chunk(self, fed: list[tuple[int, torch.Tensor]], finished: bool) -> Program[None]:
        """One text chunk's speech: decoded until the speech LM's end token;
        the answer's first :data:`FIRST_PIECE` tokens handed out as a
        :class:`Piece` to voice at once, then every :data:`VOCODER_CHUNK`."""
        session = self.session
        condition = self.condition(fed, finished)
        inputs = condition
        if self.recompute and self.previous is not None:
            self.cache.crop(session.slot, 0)
            inputs = torch.cat([self.previous, condition], 0)
        budget = session.speech_per_chunk
        needed = self.cache.lengths[session.slot] + int(inputs.shape[0]) + budget
        if needed > self.cache.capacity:
            raise EngineError("the answer's speech passes the speech LM's context")
        made: list[int] = []
        for t in range(budget):
            step = inputs if t == 0 else torch.tensor([made[-1]])
            choice = SpeechChoice(session, list(self.tokens))
            result = yield Step(step, speech=True, pick=Pick(speech_picks, choice))
            token = int(result.picked)
            if session.keep_trace:
                session.trace.speech.append(token)
            if token == self.eos:
                break
            made.append(token)
            self.tokens.append(token)
            self.buffer.append(token)
            size = VOCODER_CHUNK if self.handed else FIRST_PIECE
            if len(self.buffer) >= size:
                yield Piece(len(session.fed), self.buffer[:size], flush=not self.handed)
                self.buffer = self.buffer[size:]
                self.handed = True
        if self.recompute:
            self.previous = condition
            if made:
                with torch.no_grad():
                    spoken = self.tts.emb_code[0](torch.tensor(made, device=condition.device))
                self.previous = torch.cat([condition, spoken], 0)

    def flush(self) -> list[int]:
        rest, self.buffer = self.buffer, []
        return rest


def speech_picks(steps: list[tuple[StepResult, SpeechChoice]]) -> list[int]:
    """The next speech token of every answer whose step of this tick named
    this pick, chosen together on the logits' device
    (:func:`choose_chunk_speech_tokens`)."""
    rows = [
        SpeechRow(result.logits, previous, session.speech_sampling, session.speech_generator)  # type: ignore[arg-type]  # speech LM steps have a head: logits set
        for result, (session, previous) in steps
    ]
    tokens, _ = choose_chunk_speech_tokens(rows)
    if all(session.follow is None for _, (session, _) in steps):
        return tokens
    seen = unfiltered_scores(rows).cpu().numpy()
    for k, (_, (session, _)) in enumerate(steps):
        if session.follow is not None:  # in logit units, as the text's
            temperature = session.speech_sampling.temperature
            tokens[k] = session.follow("speech", tokens[k], seen[k] * temperature)
    return tokens


def warm_answer_voices(
    shared: SharedModel,
    samples: np.ndarray,
    buckets: tuple[int, ...] = BATCH_BUCKETS,
    seconds: int = 3,
) -> int:
    """The vocoder's shapes of spoken answers starting together in the voice
    of ``samples`` (a first piece, ``seconds`` whole seconds, the end), at
    each batch size of ``buckets``, each twice: a graphed shape runs eagerly
    the first time and is captured the second. Eight chats answering at once
    met these in the serving path, holding the side lane (and every random
    draw's lock) for the eager runs and captures (16 of its 148 py-spy
    samples in such a round on an H200). On the side lane, at the warm-up;
    returns the vocoder calls made. A failure is logged, not raised: serving
    makes the same shapes when it first needs them."""
    pushes = [
        (FIRST_PIECE, False, True),
        *[(VOCODER_CHUNK, False, False)] * seconds,
        (2, True, False),
    ]
    calls = 0
    try:
        runner = shared.voice_runner()
        for streams in (bucket for bucket in buckets for _ in range(2)):
            voices = [shared.open_voice(samples, False) for _ in range(streams)]
            for count, last, flush in pushes:
                voice_together(runner, [(v, [SILENCE_TOKEN] * count, last, flush) for v in voices])
                calls += 1
    except Exception:
        log.warning("the vocoder's warm-up for answers stopped", exc_info=True)
    return calls
