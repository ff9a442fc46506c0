"""Chat and half-duplex sessions in slots: the model's simplex streaming code
(``streaming_prefill`` / ``streaming_generate``) owned here, over the model's
own modules and weights, every piece of session state its own.

A :class:`SlotSimplex` is one conversation of that API. Its LLM context is its
slot of the batch loop's cache. A message's prompt is built as the model code
builds it (the first message through the chat template, a user turn after an
answer opened with ``<|tts_eos|><|im_end|>``, ...); its text, images and
audio become embeddings through the model code's own ``get_vllm_embedding``
and ``get_audio_embedding`` (on the encoders' lane, every chat's prompt
waiting for it in one call: :mod:`~omnilive.engines.minicpmo.sessions.simplex.prompts`);
the embeddings go into
the slot as one forward, batched with the other sessions' steps. A message's
audio is a whole recording, encoded at once, as the unified code does when
asked (the checkpoint's code encodes it as a live stream, which only takes
recordings of about a second: its placeholders outnumber its embeddings).

An answer is one program on the batch loop's thread
(:mod:`~omnilive.engines.minicpmo.runtime.programs`), in step with every other
session decoding, its choices made by
:mod:`~omnilive.engines.minicpmo.sessions.simplex.rules`:

- the LLM decodes as ``ChunkPrefillChunkGenerate`` does: the assistant's
  opening tokens, then a token a step, in chunks of 10 (the first chunk
  decides one more);
- the tokens each chunk fed, with their hidden states, condition the speech
  LM (text embedding + normalised projected hidden, as
  ``TTSStreamingGenerator``), which then decodes until its end token; with
  the published ``sliding_recompute`` attention its context restarts at
  every chunk from the previous chunk's condition and speech;
- every 25 speech tokens leave the program for the vocoder (the session's
  :class:`~omnilive.engines.minicpmo.sessions.voice.vocoder.VoiceStream`, on the side lane,
  batched with the duplex sessions' pushes) while the program decodes on;
  the answer's first :data:`FIRST_PIECE` already, voiced at once (the
  audio's cut into pieces is the answer's first audio; its tokens are the
  same).

:meth:`SlotSimplex.interrupt` (a reader that left) ends the answer at its
next step, not after the piece in hand.

One difference from the published code, which no client can rely on: its
answer's final speech, when it arrives with a whole second or more buffered,
is voiced as "last" twice (that second, then the lookahead after it); here
only the real end is.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch

from omnilive.engines.base import EngineError
from omnilive.engines.messages import HistoryTruncation, TextAudioChunk
from omnilive.engines.minicpmo.runtime.batch import StepResult
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.programs import Pick, Program, Step
from omnilive.engines.minicpmo.sessions.duplex.session import VOICE_KEY
from omnilive.engines.minicpmo.sessions.encoders.units import Failed
from omnilive.engines.minicpmo.sessions.sampling import ANSWER_SPEECH, SpeechSampling, TextSampling
from omnilive.engines.minicpmo.sessions.shared import SharedModel
from omnilive.engines.minicpmo.sessions.simplex.prompts import (
    PROMPT_KEY,
    prompt_embeddings,
    prompt_inputs,
)
from omnilive.engines.minicpmo.sessions.simplex.rules import (
    PENALTY_WINDOW,
    AnswerRow,
    SimplexVocab,
    choose_answer_tokens,
)
from omnilive.engines.minicpmo.sessions.simplex.speech import Piece, SpeechTurn
from omnilive.engines.minicpmo.sessions.simplex.window import Turn, TurnWindow
from omnilive.engines.minicpmo.sessions.voice.vocoder import VoiceStream, voice_together
from omnilive.engines.truncation import tokens_to_drop

log = logging.getLogger(__name__)

TEXT_CHUNK = 10  # LLM tokens a chunk (the first chunk decides one more)
SPEECH_PER_CHUNK = 500  # the most speech tokens one text chunk makes (the model code's)
# A session's turn state: what a snapshot or a crop restores with the cache.
TURN_STATE = ("first", "new_user_msg", "llm_generated", "audio_chunk_idx", "open")
# Speech LM attentions whose context handling is owned here.
SUPPORTED_SPEECH_ATTENTION = ("sliding_recompute", "full_attention")

# A hook of the equality harness: (kind, our token, what it was chosen from) -> token.
Follow = Callable[[str, int, Any], int]


@dataclass
class AnswerTrace:
    """What an answer decided (kept for the equality harness)."""

    text: list[int] = field(default_factory=list)  # every choice, terminator included
    speech: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # each text step's, raw


class _TextChoice(NamedTuple):
    session: SlotSimplex
    window: list[int]
    sampling: TextSampling
    suppress: bool


def speech_supported(model: Any) -> bool:
    """Whether this module owns the model's speech LM context handling."""
    tts = getattr(model, "tts", None)
    return tts is None or getattr(tts, "attention_type", "") in SUPPORTED_SPEECH_ATTENTION


class SlotSimplex:
    """One conversation of the simplex API in ``slot`` of ``loop``'s cache."""

    def __init__(
        self,
        shared: SharedModel,
        loop: BatchLoop,
        slot: int,
        *,
        suppress_text_only: bool = True,
        speech: SpeechSampling = ANSWER_SPEECH,
        speech_per_chunk: int = SPEECH_PER_CHUNK,
        seed: int | None = None,
        keep_trace: bool = False,
    ) -> None:
        self.shared = shared
        self.loop = loop
        self.slot = slot
        # The unified code masks the forbidden punctuation only when it speaks.
        self.suppress_text_only = suppress_text_only
        self.speech_sampling = speech
        self.speech_per_chunk = speech_per_chunk
        self.vocab = SimplexVocab.of(shared.tokenizer)
        self.think = str(getattr(shared.model, "think_str", "")).replace("\\n", "\n")
        seed = seed if seed is not None else secrets.randbits(62)
        self.generator = torch.Generator().manual_seed(seed)
        self.speech_generator = torch.Generator().manual_seed(seed + 1)
        self.keep_trace = keep_trace
        self.follow: Follow | None = None
        self.trace = AnswerTrace()
        self.kv_length = 0
        self.first = True
        self.new_user_msg = True
        self.llm_generated = False
        self.audio_chunk_idx = 0  # a turn's audio messages so far
        # What the context ends in: "none" (a closed message, or nothing),
        # "user" (a user message the answer's opening closes), "answer" (an
        # answer the next message's opening closes).
        self.open = "none"
        self.voice: VoiceStream | None = None
        self.fed: list[int] = []  # the answer's text tokens fed so far
        self.stop_requested = False  # set from any thread: see interrupt()
        theta = float(getattr(shared.model.llm.config, "rope_theta", 10000.0))
        self.window = TurnWindow(loop, slot, theta)
        # The positions a message leaves free for the answer after it: the
        # oldest turns leave to make them (the view sets it from the answer's
        # max_new_tokens).
        self.answer_room = TEXT_CHUNK
        # Which of them may leave, and when (the Realtime API's truncation).
        self.truncation = HistoryTruncation()

    # --- a message ----------------------------------------------------------------------

    async def prefill(
        self,
        role: str,
        content: list[Any],
        *,
        last: bool = False,
        omni_mode: bool = False,
        max_slice_nums: int | None = None,
        use_tts_template: bool = False,
        enable_thinking: bool = False,
    ) -> int:
        """Append one message (text, PIL images, 16 kHz audio arrays) as
        ``streaming_prefill`` does; the context length after it."""
        if role not in ("system", "user", "assistant"):
            raise EngineError(f"a message's role is system, user or assistant, not {role!r}")
        audios = [np.asarray(c, np.float32) for c in content if isinstance(c, np.ndarray)]
        images = [c for c in content if not isinstance(c, str | np.ndarray)]
        marks = [_placeholder(c) for c in content]
        text = ("" if omni_mode else "\n").join(marks)
        user = role == "user"
        if user and (self.first or self.new_user_msg):
            closing = "" if self.first else self.closing()
            closing_tokens = len(self.shared.tokenizer.encode(closing, add_special_tokens=False))
            self.window.opened(Turn(self.kv_length, closing_tokens, self.turn_state()))
        if not user:
            self.new_user_msg = True
        if self.first:
            self.audio_chunk_idx = 0
            if user:
                prompt = "<|im_start|>user\n" + text
                self.new_user_msg = False
            else:
                prompt = self.shared.tokenizer.apply_chat_template(
                    [{"role": role, "content": text}],
                    tokenize=False,
                    add_generation_prompt=False,
                    use_tts_template=use_tts_template,
                    enable_thinking=enable_thinking,
                )
        elif self.new_user_msg and user:
            prompt = self.closing() + "<|im_start|>user\n" + text
            self.new_user_msg = False
        else:
            prompt = text
        self.open = "user" if user else "none"
        if role != "system" and audios and self.audio_chunk_idx == 0:
            if len(audios) > 1:
                raise EngineError("one message of a turn carries one recording, not several")
            first_ms = int(getattr(self.shared.model, "FIRST_CHUNK_MS", self.shared.first_chunk_ms))
            first = first_ms * 16  # samples at 16 kHz
            if len(audios[0]) < first:
                audios[0] = np.pad(audios[0], (first - len(audios[0]), 0))
        if audios and role != "system":
            self.audio_chunk_idx += 1
        return await self._forward(prompt, images, audios, max_slice_nums)

    def closing(self) -> str:
        """What closes the message the context ends in (the model code's
        openings: an answer is closed by the next message, a user message
        by the answer)."""
        if self.open == "answer":
            return "<|tts_eos|><|im_end|>\n"
        return "<|im_end|>\n" if self.open == "user" else ""

    async def append_message(self, role: str, text: str) -> int:
        """Close what is open and append a whole message of text, as the chat
        template writes one (an edited conversation's history, a tool's
        output, instructions for one answer); the context length after it."""
        prompt = self.closing() + f"<|im_start|>{role}\n{text}<|im_end|>\n"  # "" first
        self.open, self.new_user_msg, self.llm_generated = "none", True, False
        self.audio_chunk_idx = 0
        return await self._forward(prompt, [], [], None)

    async def crop(self, length: int, state: dict[str, Any]) -> None:
        """Cut the context back to its first ``length`` positions, the turn
        state as it was there (``state`` from :meth:`turn_state`)."""
        cache = self.loop.steps.cache
        await self.loop.call(cache.crop, self.slot, length, slot=self.slot)
        self.kv_length = length
        self.window.cropped(length)
        for name, value in state.items():
            setattr(self, name, value)

    def turn_state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TURN_STATE}

    async def _forward(
        self, prompt: str, images: list[Any], audios: list[np.ndarray], max_slice_nums: int | None
    ) -> int:
        inputs = await asyncio.to_thread(
            prompt_inputs, self.shared, prompt, images, audios, max_slice_nums, first=self.first
        )
        embeds = await self.loop.encoder_gather(
            PROMPT_KEY, partial(prompt_embeddings, self.shared), inputs
        )
        if isinstance(embeds, Failed):
            raise EngineError(f"this message could not be encoded: {embeds.error}")
        self.first = False
        capacity = self.loop.steps.cache.capacity
        room = max(TEXT_CHUNK, min(self.answer_room, capacity // 2))
        incoming = int(embeds.shape[0])
        if self.window.turns:  # a conversation's message, after the system prompt
            system = self.window.turns[0].start
            history = self.kv_length - system
            over = tokens_to_drop(self.truncation, history, incoming, capacity - room - system)
        else:
            over = self.kv_length + incoming + room - capacity
        if over > 0:
            self.kv_length -= await self.window.make_room(over, self.kv_length)
        if self.kv_length + int(embeds.shape[0]) + TEXT_CHUNK > capacity:
            raise EngineError(
                f"this message needs {int(embeds.shape[0])} positions: with the system "
                f"prompt and the last turn it would pass the context of {capacity} "
                "(minicpmo.context_length)"
            )
        await self.loop.forward(self.slot, embeds)
        self.kv_length += int(embeds.shape[0])
        return self.kv_length

    # --- the voice ----------------------------------------------------------------------

    async def set_voice(self, samples: np.ndarray) -> None:
        """Speak in the voice of ``samples`` (16 kHz): prepared on the side
        lane, or the kept preparation of the same samples."""
        self.voice = await self.shared.voice_stream(samples, False, self.loop.side_call)

    # --- an answer ----------------------------------------------------------------------

    def interrupt(self) -> None:
        """End the running answer at its next step (any thread may call it:
        the answer's reader left, and what is being decoded or voiced for it
        would be thrown away)."""
        self.stop_requested = True

    async def answer(
        self,
        sampling: TextSampling,
        max_new_tokens: int,
        *,
        audio: bool,
        use_tts_template: bool,
        enable_thinking: bool = False,
        tools: bool = False,
    ) -> AsyncIterator[TextAudioChunk]:
        """The answer, streamed: with ``audio``, a piece a second of speech
        (the vocoder voicing one while the next is decoded) with the text
        that speech comes from; without, a piece a text chunk. ``n_tokens``
        is what each piece added to the context."""
        opening = self.closing()
        self.new_user_msg = True
        self.llm_generated = True
        self.open = "answer"
        self.audio_chunk_idx = 0
        self.trace = AnswerTrace()
        self.stop_requested = False
        bos = opening + "<|im_start|>assistant\n" + ("" if enable_thinking else self.think)
        bos += "<|tts_bos|>" if use_tts_template else ""
        voice = self.voice if audio and self.loop.speech is not None else None
        bos_ids = self.shared.tokenizer.encode(bos)
        program = self._decode(bos_ids, sampling, max_new_tokens, voice, tools)
        pieces = _Pieces(program, lambda: self.stop_requested)
        if voice is not None:
            voice.restart()
        before, said = self.kv_length, ""
        name = f"minicpmo-answer-{self.slot}"  # owned: cancelled below if left running
        running = asyncio.create_task(self.loop.run(self.slot, pieces.next()), name=name)
        try:
            while True:
                piece = await running
                if piece.stopped:
                    return
                if not piece.last:  # decoding goes on while this piece is voiced
                    running = asyncio.create_task(
                        self.loop.run(self.slot, pieces.next()), name=name
                    )
                samples = None
                if voice is not None and (piece.speech or piece.last):
                    push = (voice, piece.speech, piece.last, piece.flush)
                    samples = await self.loop.side_gather(
                        VOICE_KEY, partial(voice_together, voice.runner), push
                    )
                text = self.shared.tokenizer.decode(self.fed[: piece.text_tokens])
                if not piece.last:  # an unfinished character waits for its next token
                    text = text.rstrip("\ufffd")
                delta, said = text[len(said) :], text if len(text) > len(said) else said
                tokens, before = self.kv_length - before, self.kv_length
                if delta or samples is not None or piece.last:
                    yield TextAudioChunk(text=delta, audio=samples, n_tokens=tokens)
                if piece.last:
                    return
        finally:
            if not running.done():
                running.cancel()  # the loop closes the program after its batch
            elif not running.cancelled():  # between two pieces: no thread runs it
                pieces.close()
            # Cancelled, the loop's thread may be inside it still: the loop closes it.

    def _decode(
        self,
        bos: list[int],
        sampling: TextSampling,
        max_new_tokens: int,
        voice: VoiceStream | None,
        tools: bool = False,
    ) -> Program[None]:
        """The answer's steps (see the module); yields :class:`Step` s and
        :class:`Piece` s, which :class:`_Pieces` hands out."""
        suppress = voice is not None or self.suppress_text_only
        speech = SpeechTurn(self) if voice is not None else None
        self.fed = []
        generated: list[int] = []  # every choice but terminators
        last: int | None = None
        finished = False
        call_at: int | None = None  # where in ``fed`` a function call began
        for index in range(math.ceil(max_new_tokens / TEXT_CHUNK)):
            earlier = generated[-PENALTY_WINDOW:]
            chunk: list[int] = []
            fed: list[tuple[int, torch.Tensor]] = []  # (token, its last hidden state)
            chunk_start = len(self.fed)
            for _ in range(TEXT_CHUNK + (1 if index == 0 else 0)):
                # A call's JSON needs the punctuation an answer may not say.
                choice = _TextChoice(self, earlier + chunk, sampling, suppress and call_at is None)
                if last is None:
                    result = yield Step(torch.tensor(bos), pick=Pick(_text_picks, choice))
                    self.kv_length += len(bos)
                else:
                    result = yield Step(torch.tensor([last]), pick=Pick(_text_picks, choice))
                    self.kv_length += 1
                    fed.append((last, result.hidden))
                    self.fed.append(last)
                token = int(result.picked)
                if token in self.vocab.terminators:
                    finished = True
                    break
                if tools and token == self.vocab.tool_call and call_at is None:
                    call_at = len(self.fed)  # its place once fed, at the next step
                chunk.append(token)
                generated.append(token)
                last = token
            if call_at is not None and speech is not None:
                # What was said before the call is voiced; the call is not.
                said = fed[: max(0, call_at - chunk_start)]
                if said:
                    yield from speech.chunk(said, True)
                rest = speech.flush()
                speech = None
                yield Piece(len(self.fed), rest)
            elif speech is not None and fed:
                yield from speech.chunk(fed, finished)
            elif speech is None:
                yield Piece(len(self.fed))
            if finished:
                break
        rest = speech.flush() if speech is not None else []
        yield Piece(len(self.fed), rest, last=True)


class _Pieces:
    """An answer program cut at its :class:`Piece` s: each :meth:`next` is a
    program of its own for :meth:`BatchLoop.run`, which runs the answer's
    steps up to its next piece and returns it; once ``stopped()``, the
    answer ends before its next step."""

    def __init__(self, program: Program[None], stopped: Callable[[], bool]) -> None:
        self.program = program
        self.stopped = stopped

    def next(self) -> Program[Piece]:
        value: Any = None
        try:
            while True:
                if self.stopped():
                    self.program.close()
                    return Piece(0, last=True, stopped=True)
                try:
                    item = self.program.send(value)
                except StopIteration:
                    return Piece(0, last=True)
                if isinstance(item, Piece):
                    return item
                value = yield item
        except GeneratorExit:  # cancelled: the answer goes with it
            self.program.close()
            raise

    def close(self) -> None:
        self.program.close()


def _placeholder(item: Any) -> str:
    if isinstance(item, str):
        return item
    return "<audio>./</audio>" if isinstance(item, np.ndarray) else "<image>./</image>"


def _text_picks(steps: list[tuple[StepResult, _TextChoice]]) -> list[int]:
    """The next text token of every answer whose step of this tick named
    this pick, chosen together (:func:`choose_answer_tokens`)."""
    rows = [
        AnswerRow(result.logits, window, sampling, session.vocab, suppress, session.generator)  # type: ignore[arg-type]  # LLM steps have a head: logits set
        for result, (session, window, sampling, suppress) in steps
    ]
    tokens, scores = choose_answer_tokens(rows)
    for k, (result, (session, *_)) in enumerate(steps):
        if session.keep_trace:
            session.trace.logits.append(result.logits.detach().float().cpu())  # type: ignore[union-attr]  # LLM steps have a head: logits set
        if session.follow is not None:
            tokens[k] = session.follow("text", tokens[k], scores[k])
        if session.keep_trace:
            session.trace.text.append(tokens[k])
    return tokens
