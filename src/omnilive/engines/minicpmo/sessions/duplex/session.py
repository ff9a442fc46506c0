"""Duplex sessions that share one loaded MiniCPM-o model, each in a slot.

:class:`SlotDuplex` is one audio or omni duplex session: the per-unit logic of
the model's own duplex code (prepare, prefill, the listen/speak decision, the
speech LM, the vocoder), run over the model's own modules and weights, with
every piece of session state its own:

- the LLM context lives in the session's slot of the shared
  :class:`~omnilive.engines.minicpmo.runtime.batch.SlotCache`, the speech LM's
  in the same slot of its cache; their new positions are batched with every
  other session's on the batch loop's thread;
- the streaming audio encoder's state, the vocoder's stream caches, the
  repetition history and the random generators are fields of the session,
  swapped into the shared modules only for the length of a call on one of
  the model's lanes, each running one call at a time. The voice is a
  :class:`~omnilive.engines.minicpmo.sessions.voice.vocoder.VoiceStream`; the encoders are
  :mod:`~omnilive.engines.minicpmo.sessions.encoders.units`.

A unit is one relay (:meth:`SlotDuplex.unit`): its frames' CPU threads, the
encoders' lane, the batch loop, the side lane (the lanes each gathering the
units waiting for them into one call), and back.
The decisions themselves are :mod:`~omnilive.engines.minicpmo.sessions.duplex.unit_rules`.
A unit feeds ``<unit>``, the frames (``<image>`` slices ``</image>``) and the
audio as ONE forward (the model code feeds them piece by piece: the same
positions, the same causal attention); the unit's terminator and
``</unit>``, which the model code feeds at its ``finalize``, after the
result was sent, lead the next unit's forward instead (the same positions
again: one forward fewer a unit, where a forward is the costly part), unless
the unit's close slides the window: then the finalize feeds them and makes
the window's edits at once, between units (``window.py``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch

from omnilive.engines.job_queue import Job, JobQueue, Relay
from omnilive.engines.messages import ContextWindow, WindowMode
from omnilive.engines.minicpmo.runtime.batch import StepResult
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.programs import Pick, Program, Step
from omnilive.engines.minicpmo.sessions import sampling
from omnilive.engines.minicpmo.sessions.duplex.speech_choice import (
    SpeechPick,
    Uniforms,
    speech_condition,
    speech_picks,
)
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import (
    NOTHING_FED,
    SPEECH_TOKENS_PER_UNIT,
    Decided,
    TextChoice,
    UnitOutcome,
    choose_tokens,
    text_picks,
)
from omnilive.engines.minicpmo.sessions.duplex.window import SlidingContext
from omnilive.engines.minicpmo.sessions.encoders.units import (
    UNIT_KEY,
    AudioStream,
    EncodedUnit,
    Failed,
    UnitRequest,
    encode_requests,
    kept_voice_embeddings,
    prepare_unit,
)
from omnilive.engines.minicpmo.sessions.shared import SharedModel
from omnilive.engines.minicpmo.sessions.voice.vocoder import VoiceStream, voice_together

log = logging.getLogger(__name__)
T = TypeVar("T")

VOICE_KEY = "voice"  # the side lane's gather key for sessions' vocoder pushes
_Decided = tuple["UnitOutcome", bool]  # a unit's outcome; whether its voice flushes


class SlotDuplex:
    """One duplex session in ``slot`` of ``loop``'s cache (see the module)."""

    def __init__(
        self,
        shared: SharedModel,
        loop: BatchLoop,
        slot: int,
        *,
        text: sampling.TextSampling = sampling.DUPLEX_TEXT,
        speech: sampling.SpeechSampling = sampling.DUPLEX_SPEECH,
        seed: int | None = None,
        max_speak_tokens: int = 20,
        keep_logits: bool = False,
        window: ContextWindow | None = None,
    ) -> None:
        self.shared = shared
        self.loop = loop
        self.slot = slot
        self.text = text
        self.speech = sampling.duplex_speech(speech)
        self.max_speak_tokens = max_speak_tokens
        self.keep_logits = keep_logits
        # Not torch.seed(): it reseeds the process's default generators, which a
        # CUDA graph capture on another thread may be holding.
        seed = seed if seed is not None else secrets.randbits(62)
        # Uniform numbers for the draws come from these, on the CPU (see
        # choose_tokens and speech_choice).
        self.generator = torch.Generator().manual_seed(seed)
        self.speech_generator = torch.Generator().manual_seed(seed + 1)
        self.speech_uniforms = Uniforms(self.speech_generator)
        self.history: list[int] = []  # the repetition penalty's memory
        self.turn_ended = True
        self.pending_logits: torch.Tensor | None = None
        self.finalize_tokens: list[int] | None = None
        # Finalized units' closing tokens: counted in kv_length, fed at the
        # head of the next unit's forward.
        self.closing: list[int] = []
        self.window = window or ContextWindow(mode=WindowMode.OFF)
        self.context: SlidingContext | None = None  # once prepared
        self._closed_unit: tuple[list[int], bool] = ([], True)  # spoken tokens, listened
        self.audio = AudioStream(mel=None)
        # The next position of the running turn's speech LM context (0: a new
        # turn); the context itself is the session's slot of the loop's speech cache.
        self.speech_position = 0
        self.speech_capacity = loop.speech.cache.capacity if loop.speech is not None else 0
        self.voice: VoiceStream | None = None
        self.kv_length = 0
        # Thread hand-offs of this session's work so far (each awaited job
        # crosses to an engine thread and back; a relay's legs one each, and
        # back): what benchmarks report per unit.
        self.handoffs = 0
        self.prefilled = self.vocoding = 0.0  # when the last unit's forward, voice began
        # Kept only with keep_logits (the equality harness): the logits each
        # speech token and each text token (after penalties) was chosen from.
        self.speech_logits: list[torch.Tensor] = []
        self.text_choices: list[torch.Tensor] = []

    # --- prepare ------------------------------------------------------------------------

    async def prepare(
        self,
        prefix: str | None,
        suffix: str | None,
        ref_audio: np.ndarray | None = None,
        tts_voice: np.ndarray | None = None,
    ) -> int:
        """The system turn: prefix text, the reference voice's audio
        embeddings (``ref_audio``), suffix text; and the voice it speaks in
        (``tts_voice``, 16 kHz). Returns the context length."""
        shared = self.shared
        self.audio = AudioStream(mel=await self._across(asyncio.to_thread(shared.new_mel)))
        if tts_voice is not None and shared.generate_audio:
            self.voice = await shared.voice_stream(tts_voice, True, self._side_call)
        parts: list[torch.Tensor] = []
        if prefix:
            parts.append(shared.embed(shared.tokenizer.encode(prefix, add_special_tokens=False)))
        if ref_audio is not None:
            embeddings = self.loop.encoder_call(kept_voice_embeddings, shared, ref_audio)
            parts.append(await self._across(embeddings))
        suffix_ids = shared.tokenizer.encode(suffix, add_special_tokens=False) if suffix else []
        if suffix_ids:
            parts.append(shared.embed(suffix_ids))
        if parts:
            system = torch.cat(parts, 0)
            await self._across(self.loop.forward(self.slot, system))
            self.kv_length += int(system.shape[0])
        theta = float(getattr(shared.model.llm.config, "rope_theta", 10000.0))
        self.context = SlidingContext(self.window, shared.tokenizer, theta)
        self.context.ledger.system(self.kv_length, suffix=tuple(suffix_ids))
        return self.kv_length

    # --- a unit -------------------------------------------------------------------------

    async def unit(
        self,
        audio: np.ndarray | None,
        frames: list[Any] | None = None,
        max_slice_nums: int = 1,
        force_listen: bool = False,
    ) -> tuple[dict[str, int], UnitOutcome]:
        """:meth:`prefill` then :meth:`generate` as ONE relay
        (:class:`~omnilive.engines.job_queue.Relay`): the frames' image
        processing on CPU threads (a unit with frames), the encoders' lane (the
        mel features, then the encoders with every waiting unit's), the batch
        loop (its forward, then its decisions), the side lane (its voice, with
        the other sessions' waiting pushes), then back to the event loop once:
        four thread crossings for a speaking unit, three for a listening one,
        one more with frames."""
        request = self._request(audio, frames, max_slice_nums)
        if request is None:
            return dict(NOTHING_FED), self._silent()
        fed, outcome = await self._relay(request, None, force_listen)
        assert outcome is not None
        return fed, outcome

    async def prefill(
        self, audio: np.ndarray | None, frames: list[Any] | None = None, max_slice_nums: int = 1
    ) -> dict[str, int]:
        """One unit's input: ``<unit>``, each frame's slices, the audio's
        embeddings, as one forward; the logits of its last position wait for
        :meth:`generate`. Returns the image slices and the embedding positions
        fed per kind."""
        request = self._request(audio, frames, max_slice_nums)
        if request is None:
            return dict(NOTHING_FED)
        fed, _ = await self._relay(request, None, None)
        return fed

    async def generate(self, force_listen: bool = False) -> UnitOutcome:
        """Listen, or speak up to ``max_speak_tokens`` text tokens and voice
        them; the unit stays open until :meth:`finalize`. The text and the
        speech tokens are decided on the batch loop's thread (one program,
        in step with the other sessions decoding), the audio on the side lane."""
        if self.pending_logits is None:
            return self._silent()
        logits, self.pending_logits = self.pending_logits, None
        _, outcome = await self._relay(None, logits, force_listen)
        assert outcome is not None
        return outcome

    def _request(
        self, audio: np.ndarray | None, frames: list[Any] | None, max_slice_nums: int
    ) -> UnitRequest | None:
        """What the encoders' lane needs of a unit (None: nothing to feed).
        The closing tokens of the last unit lead it (counted when finalized)."""
        has_audio = audio is not None and len(audio) > 0
        if not frames and not has_audio:
            return None
        closing = self.context.lead(self.closing) if self.context else self.closing
        lead, self.closing = [*closing, self.shared.vocab.unit], []
        samples = np.asarray(audio, np.float32) if has_audio else None
        return UnitRequest(lead, list(frames or []), max_slice_nums, samples, self.audio)

    def _silent(self) -> UnitOutcome:
        return UnitOutcome(True, [], [], "", [], None, False, self.kv_length)

    async def _relay(
        self, request: UnitRequest | None, logits: torch.Tensor | None, force_listen: bool | None
    ) -> tuple[dict[str, int], UnitOutcome | None]:
        """The legs of a unit from ``request`` (prepare, encode and feed it)
        or from ``logits`` (a prefill's), to its decisions unless
        ``force_listen`` is None, and its voice; what was fed and the outcome."""
        relay = Relay(partial(self._route, request, logits, force_listen))
        try:
            results = await relay.run()
        finally:
            self.handoffs += relay.crossings
        [(index, decided)] = [(k, r) for k, r in enumerate(results) if isinstance(r, Decided)]
        if decided.outcome is not None and index + 1 < len(results):
            decided.outcome.audio = results[index + 1]
            decided.outcome.vocoder_ms = (time.perf_counter() - self.vocoding) * 1000
        return decided.fed, decided.outcome

    def _route(
        self,
        request: UnitRequest | None,
        logits: torch.Tensor | None,
        force_listen: bool | None,
        relay: Relay,
    ) -> tuple[JobQueue[Any], Job] | None:
        """The next leg of a unit's relay after the last one's outcome (see
        :meth:`_relay`), on the thread that ended it."""
        done, loop = relay.results, self.loop
        if any(isinstance(result, Decided) for result in done):  # decided: its voice
            return self._voice_leg(done[-1]) if isinstance(done[-1], Decided) else None
        last = done[-1] if done else request
        if isinstance(last, Failed):
            raise last.error
        if isinstance(last, UnitRequest):
            if last.unprepared and loop.prep is not None:  # its CPU halves first, on CPU threads
                return loop.prep_leg(partial(prepare_unit, self.shared), last)
            return loop.encoder_leg(UNIT_KEY, partial(encode_requests, self.shared), last)
        # The forward (of an encoded unit; none from a prefill's logits) and the decisions.
        closing = len(request.lead) - 1 if request is not None else 0
        return loop.program_leg(self.slot, self._program(last, closing, logits, force_listen))

    def _voice_leg(self, decided: Decided) -> tuple[JobQueue[Any], Job] | None:
        """A spoken unit's speech to the side lane, with the other sessions'
        pushes waiting for it: one vocoder batch a round."""
        outcome, voice = decided.outcome, self.voice
        if outcome is None or outcome.is_listen or voice is None or not self.shared.generate_audio:
            return None
        self.vocoding = time.perf_counter()
        push = (voice, outcome.speech_tokens, outcome.end_of_turn, decided.flush)
        return self.loop.side_leg(VOICE_KEY, partial(voice_together, voice.runner), push)

    def _program(
        self,
        encoded: EncodedUnit | None,
        closing: int,
        logits: torch.Tensor | None,
        force_listen: bool | None,
    ) -> Program[Decided]:
        """On the batch loop's thread: the unit's forward (``encoded``), then,
        unless ``force_listen`` is None (its logits then wait for
        :meth:`generate`), its decisions (from ``logits`` when nothing is fed)."""
        fed = dict(NOTHING_FED)
        if encoded is not None:
            if self.context is not None:  # the window's edits, if due
                yield from self.context.slide(self.loop.steps.cache, self.slot)
            result = yield Step(encoded.embeds)
            self.kv_length += int(encoded.embeds.shape[0]) - closing  # counted when finalized
            self.prefilled = time.perf_counter()
            logits, fed = result.logits, encoded.counts()
        assert logits is not None
        if force_listen is None:
            self.pending_logits = logits
            return Decided(fed, None, False)
        outcome, flush = yield from self._decide(logits, force_listen)
        return Decided(fed, outcome, flush)

    def _decide(self, logits: torch.Tensor, force_listen: bool) -> Program[_Decided]:
        """The unit's text tokens from the prefill's ``logits`` on, then (when
        it speaks) its speech tokens; the outcome and whether the vocoder
        voices everything it can (see :meth:`VoiceStream.push`)."""
        vocab, rules = self.shared.vocab, self.shared.rules
        started = time.perf_counter()
        decided: list[int] = []
        if force_listen and rules.close_turn_on_forced_listen and not self.turn_ended:
            decided.append(vocab.turn_eos)
            logits = (yield from self._step_tokens([vocab.turn_eos])).logits
            self.turn_ended = True
            if self.voice is not None:
                self.voice.restart()
        spoken: list[tuple[int, torch.Tensor]] = []  # (token, hidden) after the first
        terminator: int | None = None
        is_listen = end_of_turn = False
        seen: list[torch.Tensor] = []
        last = self.max_speak_tokens - 1  # the step that decides no token: the budget's end
        # The first token from the prefill's logits, alone; each later one
        # picked with the other sessions' of the same batch (programs.py).
        chosen = None if force_listen or last == 0 else choose_tokens([(logits, self._text())])[0]
        for j in range(self.max_speak_tokens):
            if j == last:
                terminator = vocab.chunk_eos
                decided.append(terminator)
                break
            if force_listen:
                token = vocab.listen
            else:
                assert chosen is not None
                token = chosen
                if self.keep_logits:
                    seen.append(logits.detach().float().cpu())
                if token == vocab.listen and not self.turn_ended:
                    token = vocab.tts_bos
            is_listen = token == vocab.listen
            decided.append(token)
            if token in vocab.terminators:
                terminator = token
                break
            self.turn_ended = False
            if j != 0 and rules.char_limit is not None:
                text = self._decode([t for t, _ in spoken] + [token])
                if len(text) >= rules.char_limit:
                    terminator = decided[-1] = vocab.chunk_eos
                    break
            # The next token is picked unless no choice comes next.
            pick = Pick(text_picks, self._text()) if not force_listen and j + 1 < last else None
            result = yield from self._step_tokens([token], pick)
            logits, chosen = result.logits, result.picked
            end_of_turn = token == vocab.turn_eos
            if end_of_turn:
                self.turn_ended = True
            if j != 0:
                spoken.append((token, result.hidden))
        self.finalize_tokens = ([terminator] if terminator is not None else []) + [vocab.unit_end]
        tokens = [t for t, _ in spoken]
        self._closed_unit = (tokens, is_listen)
        llm_ms = (time.perf_counter() - started) * 1000
        end_of_turn = end_of_turn and not is_listen
        text = "" if is_listen else self._decode(tokens)
        outcome = UnitOutcome(
            is_listen, decided, tokens, text, [], None, end_of_turn, self.kv_length, seen, llm_ms
        )
        if is_listen:
            return outcome, False
        flush = False
        if self.shared.generate_audio:
            flush = yield from self._speak(spoken, outcome)
        return outcome, flush

    async def finalize(self) -> None:
        """Close the unit: its terminator (if any) and ``</unit>`` into the
        context, fed with the next unit (see the module)."""
        if self.finalize_tokens is not None:
            tokens, self.finalize_tokens = self.finalize_tokens, None
            self.closing += tokens
            self.kv_length += len(tokens)
            if self.context is not None:  # the window slides (window.py)
                self.kv_length = self.context.closed(self.kv_length, *self._closed_unit)
                if self.context.edits:  # now, between units: off the next unit's wait
                    closing, self.closing = self.closing, []
                    cache = self.loop.steps.cache
                    await self.loop.run(self.slot, self.context.slide(cache, self.slot, closing))

    def append(self, token_ids: list[int]) -> int:
        """Text between two units (after :meth:`finalize`, before the next
        unit): fed at the head of the next unit's forward, after the last
        unit's closing tokens, and a unit of its own for the window, as the
        model code's path writes it (``minicpmo/appends.py``)."""
        self.closing += token_ids
        self.kv_length += len(token_ids)
        if self.context is not None:
            self.kv_length = self.context.closed(self.kv_length, [], True)
        return len(token_ids)

    def _decode(self, tokens: list[int]) -> str:
        return self.shared.tokenizer.decode(tokens, skip_special_tokens=True) if tokens else ""

    # --- the speech LM ------------------------------------------------------------------

    def _speak(self, spoken: list[tuple[int, torch.Tensor]], outcome: UnitOutcome) -> Program[bool]:
        """The unit's speech tokens into ``outcome``; whether the vocoder
        voices all it can (a turn's start, or the flavour always does)."""
        started = time.perf_counter()
        condition = speech_condition(self.shared.model.tts, spoken)
        needed = self.speech_position + int(condition.shape[0]) + SPEECH_TOKENS_PER_UNIT
        if needed > self.speech_capacity:
            # A turn longer than the speech LM's context (minutes of speech):
            # its speech goes on from a fresh context, as a new turn's would.
            log.warning("slot %d: the speech LM's context is full; restarting it", self.slot)
            self.speech_position = 0
        turn_start = self.speech_position == 0
        least = 0 if outcome.end_of_turn or turn_start else SPEECH_TOKENS_PER_UNIT
        tokens = yield from self._speech_tokens(condition, least)
        if outcome.end_of_turn:
            self.speech_position = 0
        else:
            self.speech_position += int(condition.shape[0]) + len(tokens)
        outcome.speech_tokens = tokens
        outcome.speech_ms = (time.perf_counter() - started) * 1000
        return turn_start or self.shared.rules.always_flush

    def _speech_tokens(self, condition: torch.Tensor, least: int) -> Program[list[int]]:
        """Up to :data:`SPEECH_TOKENS_PER_UNIT` speech tokens after
        ``condition``, continuing the turn's speech LM context (the session's
        slot of the loop's speech cache, batched with the other sessions'):
        decide a token per step, stop at the end-of-speech token; the last
        decided token (the end, or the one past the budget) is not returned
        nor fed."""
        tts = self.shared.model.tts
        eos = int(tts.config.num_audio_tokens) - 1
        cache = self.loop.speech.cache  # type: ignore[union-attr]  # slot_loop sets it for a model with a tts
        if cache.lengths[self.slot] != self.speech_position:  # a new turn: from position 0
            cache.crop(self.slot, self.speech_position)  # a program owns its slot's caches
        inputs = condition
        decided: list[int] = []
        for t in range(SPEECH_TOKENS_PER_UNIT):
            if t > 0:  # the token's id: the loop's thread looks its embedding up
                inputs = torch.tensor([decided[-1]])
            seen = self.speech_logits if self.keep_logits else None
            allow = t >= least
            item = SpeechPick(decided, allow, eos, self.speech, self.speech_uniforms, seen)
            pick = Pick(speech_picks, item)
            result = yield Step(inputs, speech=True, pick=pick)
            token = result.picked
            if token == eos:
                break
            decided.append(token)
        else:
            decided.pop()  # the one past the budget: decided, never fed
        return decided

    # --- the LLM context ----------------------------------------------------------------

    async def _side_call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the side lane, counted in :attr:`handoffs`."""
        return await self._across(self.loop.side_call(fn, *args))

    async def _across(self, work: Awaitable[T]) -> T:
        """``work`` (a job of the engine's threads), counted in :attr:`handoffs`."""
        self.handoffs += 2
        return await work

    def _step_tokens(self, tokens: list[int], pick: Pick | None = None) -> Program[StepResult]:
        """Feed token ids from within a program; the step's result."""
        result = yield Step(torch.tensor(tokens), pick=pick)
        self.kv_length += len(tokens)
        return result

    def _text(self) -> TextChoice:
        """What this session's next text token's choice needs besides logits."""
        seen = self.text_choices if self.keep_logits else None
        return TextChoice(self.history, self.text, self.shared.vocab, self.generator, seen)
