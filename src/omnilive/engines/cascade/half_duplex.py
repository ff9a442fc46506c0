"""Half-duplex voice turns on the cascade, with work started before the turn ends.

The session runner calls :meth:`hear` with the speech so far while the user
talks. That hands work to the session's own background thread and returns at
once, so the runner's VAD is never held up:

- while the user speaks, the speech so far is transcribed now and then
  (``partial_transcript``): after each second of new speech, and as soon as the
  last ~0.2 s sound quiet, which is often the end (the runner's VAD waits
  longer before it calls it a pause); each transcript's words are read into
  the LLM's cache, so that at the pause only the words since are new to it;
- when the VAD hears a pause, the answer is started: the speech is transcribed
  (or the quiet-moment transcript reused, if no speech came after it), the LLM
  judges whether the words end the turn and runs until its first piece is
  complete and spoken, then the stream is parked.

If :meth:`prefill` then gets the same speech (the same samples, give or take a
silent tail) it adopts the parked answer: the first chunk of :meth:`generate`
carries audio at once. Any other speech, or new speech in :meth:`hear`, cancels
the early work, which is discarded without touching the history.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from omnilive.engines.base import CapabilityError, EngineError
from omnilive.engines.cascade._vad import FRAME, RATE, FrameVAD
from omnilive.engines.cascade.answer import AnswerStream, SpokenSentence
from omnilive.engines.cascade.asr import Transcript
from omnilive.engines.cascade.conversation import ConversationView, Fit
from omnilive.engines.cascade.early_work import EarlyWork, TurnStats
from omnilive.engines.cascade.llm import LlamaChat, Message
from omnilive.engines.cascade.stack import (
    ModelStack,
    Notices,
    log,
    text_of,
)
from omnilive.engines.messages import (
    AudioPart,
    ChatMessage,
    HalfDuplexOptions,
    Modality,
    Part,
    TextAudioChunk,
    Tools,
    modalities_of,
)
from omnilive.engines.sync_views import SyncHalfDuplexSession

PARTIAL_STEP_S = 1.0  # new speech between two partial transcripts
QUIET_TAIL_S = 0.2  # this much trailing audio without speech triggers a transcript
QUIET_MIN_NEW_S = 0.3  # ...if at least this much speech came since the last one
TAIL_SPEECH_THRESHOLD = 0.5  # VAD probability that makes extra samples "speech"
TAIL_SPEECH_FRAMES = 3  # ~100 ms of it means the user said more
INAUDIBLE = "[inaudible]"
# A turn check waits at most this long for the early answer's judgement:
# Whisper and ~15 tokens of the LLM from the pause on, usually there within
# 100 ms of the first check. Later, it is "not yet" (see end_of_turn).
JUDGE_WAIT_S = 1.0


@dataclass(eq=False)
class _Turn:
    fit: Fit
    answer: AnswerStream | None
    head: list[TextAudioChunk]


class CascadeHalfDuplex(ConversationView, SyncHalfDuplexSession):
    """A voice conversation whose history persists across turns, within the context."""

    def __init__(
        self, stack: ModelStack, require: Callable[[set[Modality]], None], early: bool = True
    ) -> None:
        self._stack = stack
        self._require = require
        self._answers_early = early  # settings: cascade.early_answer
        self._notices = Notices()
        self._options = HalfDuplexOptions()
        self._voice = stack.tts.resolve_voice(None).espeak
        self._conversation = self._stack.conversation("")
        # The background thread reads the history while the runner's thread
        # may commit or roll it back.
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cascade-hd")
        self._vad = FrameVAD()  # ~60 ms to create: not on the first hear()
        self._early: EarlyWork | None = None
        self._partial_samples = 0
        self._turn: _Turn | None = None
        self._speaking: AnswerStream | None = None  # the answer generate() is streaming
        self._closed = False
        self.partial_transcript = ""
        self.context_tokens = 0
        self.stats = TurnStats()
        self._first_sentence: SpokenSentence | None = None
        self._tools = Tools()

    # --- observable state -------------------------------------------------

    def settle(self) -> None:
        """Wait until early work in flight is done (for tests and benchmarks)."""
        early = self._early
        if early is not None and early.future is not None:
            early.future.exception()

    # --- the view ----------------------------------------------------------

    def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        self._require(modalities_of([ChatMessage("system", tuple(system))]))
        self._cancel_early(wait=True)
        if any(isinstance(p, AudioPart) for p in system):
            self._notices.add(
                "voice cloning is not available on the cascade engine: "
                "the reference audio in the system content was not used"
            )
        self._options = options
        self._voice = self._stack.voice(options.voice, self._notices).espeak
        with self._lock:
            self._conversation = self._stack.conversation(text_of(system))
            fit = self._conversation.fit(
                self._stack.llm.count, self._budget(), truncation=self._options.truncation
            )
        self.context_tokens = fit.tokens
        return fit.tokens

    def hear(self, speech_so_far: np.ndarray, paused: bool) -> None:
        if not self._answers_early:
            return  # all the work waits for prefill
        if self._closed or self._turn is not None or self._speaking is not None:
            return  # a turn is under way: nothing heard now starts another yet
        early = self._early
        if early is not None and early.speculative:
            if self._same_speech(early.speech, speech_so_far):
                return  # only silence was added: the answer in flight still fits
            self._cancel_early(wait=False)
            early = None
        speech = np.array(speech_so_far, dtype=np.float32)
        if paused:
            reusable = early is not None and early.quiet
            heard = early if reusable and self._same_speech(early.speech, speech) else None
            if heard is None:
                self._cancel_early(wait=False)
            self._start_early(speech, speculative=True, heard=heard)
            return
        if early is not None and early.future is not None and not early.future.done():
            return  # one transcript at a time; the next call will catch up
        new = speech.size - self._partial_samples
        quiet = new >= QUIET_MIN_NEW_S * RATE and not self._vad.has_speech(
            speech[-round(QUIET_TAIL_S * RATE) :], TAIL_SPEECH_THRESHOLD, 1
        )
        if quiet or new >= PARTIAL_STEP_S * RATE:
            self._partial_samples = speech.size
            self._start_early(speech, speculative=False, quiet=quiet)

    @property
    def judges_words(self) -> bool:
        return self._answers_early and isinstance(self._stack.llm, LlamaChat)

    def end_of_turn(self, speech: np.ndarray) -> float | None:
        """The language model's chance that the words heard at the pause end
        the user's message (``LlamaChat.end_probability``): read by the early
        answer started at that pause, for this same speech (only silence
        added); None when there is none, or the model is a remote one. A
        judgement still in flight after :data:`JUDGE_WAIT_S` is "not yet"
        (0.0), and the next check asks again: left to the audio model alone,
        cut-off turns ended early on a loaded machine."""
        early = self._early
        if early is None or not early.speculative or not self._same_speech(early.speech, speech):
            return None
        if not early.judged.wait(JUDGE_WAIT_S):
            return 0.0
        return early.end_p

    def prefill(self, speech: np.ndarray) -> int:
        if self._speaking is not None:
            self._end_answer(self._speaking)  # the runner dropped the last answer early
        speech = np.asarray(speech, dtype=np.float32)
        turn = self._adopt(speech)
        if turn is None:
            self._cancel_early(wait=True)
            transcript = self._stack.asr.transcribe(speech, self._voice)
            self.stats = TurnStats(transcript.text, transcript.cost_ms)
            with self._lock:
                fit = self._fit(transcript)
            turn = _Turn(fit, None, [])
        count = self._stack.llm.count
        added = turn.fit.tokens - count(turn.fit.messages[:-1])
        with self._lock:
            self._conversation.commit(turn.fit, turn.fit.messages[-1])
        self._partial_samples, self.partial_transcript = 0, ""
        self._turn = turn
        self.context_tokens = turn.fit.tokens
        return max(1, added)

    def generate(self) -> Iterator[TextAudioChunk]:
        turn, self._turn = self._turn, None
        if turn is None:
            raise EngineError("generate before prefill")
        answer = turn.answer or self._stack.answer(
            self._stack.llm.tokens(turn.fit.messages, self._tools),
            self._options.generation,
            self._stack.spoken_budget(self._options.generation),
            self._voice if self._options.tts_enabled else None,
        )
        self._speaking = answer
        try:
            yield from turn.head
            yield from answer
        finally:
            self.context_tokens = turn.fit.tokens + answer.stats.n_tokens
            self._end_answer(answer)

    def snapshot(self) -> None:
        with self._lock:
            self._conversation.snapshot()

    # --- conversations a client edits (the Realtime API's items) -----------------

    @property
    def transcript(self) -> str | None:
        return self.stats.transcript

    @property
    def history_dropped(self) -> int:
        with self._lock:
            return self._conversation.dropped

    def keep_heard(self, text: str) -> bool:
        """The last answer in the history becomes what the user heard of it
        (none of it: the answer leaves the history)."""
        self._cancel_early(wait=True)  # it was started from the whole answer
        if self._speaking is not None:
            self._end_answer(self._speaking)
        with self._lock:
            return self._conversation.cut_answer(text)

    def set_history(self, messages: list[ChatMessage]) -> None:
        self._cancel_early(wait=True)  # it was started from the old history
        if self._speaking is not None:
            self._end_answer(self._speaking)
        system = " ".join(m.text for m in messages if m.role == "system")
        turns = [
            Message(m.role, m.text, m.tool_calls, m.tool_call_id)
            if m.text or m.tool_calls
            else None  # untranscribed speech: nothing to keep
            for m in messages
            if m.role != "system"
        ]
        with self._lock:
            self._conversation = self._stack.conversation(system)
            self._conversation.set_turns(turns)
            self._let_the_oldest_go()
        self._turn = None

    def _let_the_oldest_go(self) -> None:
        """What a prompt could not hold leaves now, not at the next answer:
        the client hears at once which items the model no longer sees. With
        truncation disabled nothing leaves, and the answer says it does not
        fit; a system prompt past the context fails there too."""
        if not self._options.truncation.enabled:
            return
        count, budget = self._stack.llm.count, self._budget()
        try:
            fit = self._conversation.fit(count, budget, truncation=self._options.truncation)
        except EngineError:
            return
        self._conversation.commit(fit)

    def respond(self, instructions: str | None = None) -> None:
        self._cancel_early(wait=True)
        extra = [Message("system", instructions)] if instructions else []
        with self._lock:
            fit = self._conversation.fit(
                self._stack.llm.count,
                self._budget(),
                *extra,
                truncation=self._options.truncation,
            )
            self._conversation.commit(fit)  # drops what no longer fits; adds nothing
        self._turn = _Turn(fit, None, [])

    def set_tools(self, tools: Tools) -> None:
        if tools.functions and not self._stack.llm.supports_tools:
            raise CapabilityError(
                "cascade",
                "tools",
                "the packaged SmolLM2 takes none: set cascade.llm.url to "
                "an OpenAI-compatible server whose model calls tools",
            )
        self._cancel_early(wait=True)
        self._tools = tools

    def set_options(self, options: HalfDuplexOptions) -> None:
        self._cancel_early(wait=True)
        voice = self._options.voice if options.voice is None else options.voice
        self._options = dataclasses.replace(options, voice=voice)

    def rollback(self) -> None:
        self._cancel_early(wait=True)
        if self._speaking is not None:
            self._speaking.close()
            self._speaking = None
        self._turn = None
        with self._lock:
            self._conversation.rollback()

    def close(self) -> None:
        self._closed = True
        self._cancel_early(wait=True)
        if self._speaking is not None:
            self._end_answer(self._speaking)
        self._executor.shutdown(wait=True, cancel_futures=True)

    @property
    def turn_timings(self) -> dict[str, float]:
        return self.stats.timings(self._first_sentence)

    def _end_answer(self, answer: AnswerStream) -> None:
        """Close an answer and put what it said in the history, once."""
        if self._speaking is not answer:
            return
        self._speaking = None
        answer.close()
        self.stats.llm_first_token_ms = answer.stats.first_token_ms
        self.stats.first_sentence_audio_ms = answer.stats.first_audio_ms
        self._first_sentence = answer.stats.sentences[0] if answer.stats.sentences else None
        with self._lock:  # one that said nothing still counts as the client's turn
            self._conversation.add("assistant", answer.text.strip())

    # --- early work ----------------------------------------------------------

    def _budget(self) -> int:
        return self._stack.llm.n_ctx - self._stack.spoken_budget(self._options.generation)

    def _fit(self, transcript: Transcript) -> Fit:
        """The prompt for this turn; the caller holds the lock."""
        user = Message("user", transcript.text or INAUDIBLE)
        return self._conversation.fit(
            self._stack.llm.count, self._budget(), user, truncation=self._options.truncation
        )

    def _start_early(
        self,
        speech: np.ndarray,
        speculative: bool,
        heard: EarlyWork | None = None,
        quiet: bool = False,
    ) -> None:
        early = EarlyWork(speech, speculative, quiet, heard=heard)
        early.future = self._executor.submit(self._work, early)
        # Work cancelled while it runs cleans up after itself when it ends.
        early.future.add_done_callback(lambda _: early.discard() if early.cancel.is_set() else None)
        self._early = early

    def _work(self, early: EarlyWork) -> None:
        """Runs on the session's thread: transcribe, and maybe start the answer."""
        try:
            self._early_work(early)
        finally:
            early.judged.set()  # a turn check waiting for end_p goes on without it

    def _early_work(self, early: EarlyWork) -> None:
        early.started = time.perf_counter()
        if early.cancel.is_set():
            return
        # A reusable transcript ran before this job on the same thread: it is done.
        transcript = early.heard.transcript if early.heard is not None else None
        if transcript is None:
            transcript = self._stack.asr.transcribe(early.speech, self._voice)
        early.transcript = transcript
        if not early.speculative:
            self.partial_transcript = transcript.text
            self._read_ahead(early, transcript)
            return
        if early.cancel.is_set():
            return
        with self._lock:
            fit = self._fit(transcript)
        prompt = self._stack.llm.tokens(fit.messages, self._tools)
        if isinstance(self._stack.llm, LlamaChat) and transcript.text:
            # Free for the answer: the same pass evaluates its prompt.
            judging = time.perf_counter()
            early.end_p = self._stack.llm.end_probability(fit.messages, prompt)
            early.end_readings = self._stack.llm.last_readings
            early.judge_ms = (time.perf_counter() - judging) * 1000
            early.judged_tokens = self._stack.llm.last_judged
            log.debug("words at the pause %r: %.3f", transcript.text, early.end_p)
        early.judged.set()
        if early.cancel.is_set():
            return
        answer = self._stack.answer(
            prompt,
            self._options.generation,
            self._stack.spoken_budget(self._options.generation),
            self._voice if self._options.tts_enabled else None,
            cancel=early.cancel,
        )
        # Run up to the end of the first sentence (and its audio), then park.
        for chunk in answer:
            early.head.append(chunk)
            if answer.stats.sentences or early.cancel.is_set():
                early.ready = time.perf_counter()
                break
        if early.cancel.is_set():
            answer.close()
            return
        early.fit, early.answer = fit, answer

    def _read_ahead(self, early: EarlyWork, transcript: Transcript) -> None:
        """Evaluate the words heard so far into the LLM's cache while the
        user is still speaking: at the pause only the words since are new to
        it, which shortens the judgement and the answer's prefill."""
        if early.cancel.is_set() or not transcript.text:
            return
        if not isinstance(self._stack.llm, LlamaChat):
            return
        with self._lock:
            fit = self._fit(transcript)
        self._stack.llm.end_probability(fit.messages)

    def _adopt(self, speech: np.ndarray) -> _Turn | None:
        """The early answer, if it was started from this same speech."""
        early = self._early
        if early is None or not early.speculative or early.future is None:
            return None
        if not self._same_speech(early.speech, speech):
            return None
        try:
            early.future.result()  # still running: finishing it beats starting over
        except EngineError as exc:
            log.warning("cascade: early answer failed, answering again: %s", exc)
            return None
        if early.answer is None or early.fit is None or early.transcript is None:
            return None
        self._early = None
        self.stats = TurnStats.adopted(early, early.transcript)
        return _Turn(early.fit, early.answer, early.head)

    def _same_speech(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether one clip is the other plus (or minus) only a silent tail."""
        n = min(a.size, b.size)
        if not np.array_equal(a[:n], b[:n]):
            return False
        tail = (a if a.size > b.size else b)[n:]
        if tail.size < FRAME:
            return True
        return not self._vad.has_speech(tail, TAIL_SPEECH_THRESHOLD, TAIL_SPEECH_FRAMES)

    def _cancel_early(self, wait: bool) -> None:
        """Stop early work; ``wait`` for the thread to let go of the models.

        :meth:`hear` does not wait (it must return at once): the thread sees
        the flag within one LLM token and closes what it started itself.
        """
        early, self._early = self._early, None
        if early is None:
            return
        early.cancel.set()
        if early.future is None:
            return
        if wait:
            try:
                early.future.result()
            except EngineError as exc:
                log.info("cascade: discarded early work had failed: %s", exc)
        if early.future.done():
            early.discard()
