"""Full duplex on the cascade: listen unit by unit, answer in 1 s audio units.

Each 1 s unit, :meth:`prefill` runs the VAD over the new audio (a few ms) and
:meth:`generate` decides. When an utterance ends (speech, then ~0.64 s of
silence) its reply is prepared on the session's own thread (Whisper, then
SmolLM2 streaming, espeak per sentence), while the unit loop keeps answering
"listen". Once audio is ready, ``generate`` hands it out one unit at a time;
``end_of_turn`` marks the last. Speech from the user while the model talks
(barge-in) or ``force_listen`` drops the rest of the reply at once.

Steps stay short: ``generate`` waits at most :data:`FIRST_AUDIO_WAIT_S` for a
reply's first audio (so a reply that is nearly ready goes out a unit sooner)
and :data:`NEXT_AUDIO_WAIT_S` for a full middle unit.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from omnilive.audio import OUTPUT_RATE
from omnilive.engines.appends import ContextNote, system_text
from omnilive.engines.base import EngineError
from omnilive.engines.cascade._vad import FrameVAD
from omnilive.engines.cascade.answer import DUPLEX_FIRST_WORDS, SentenceSplitter, SpokenSentence
from omnilive.engines.cascade.conversation import ConversationView
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.reply import Piece, Reply
from omnilive.engines.cascade.stack import (
    SPOKEN_MAX_TOKENS,
    ModelStack,
    Notices,
    log,
    spoken_system_prompt,
)
from omnilive.engines.cascade.tts import PIPER
from omnilive.engines.cascade.utterance import TurnTaking, UtteranceTracker
from omnilive.engines.messages import (
    DuplexOptions,
    DuplexUnit,
    GenerationOptions,
    PrefillStats,
    Voice,
)
from omnilive.engines.sync_views import SyncDuplexSession

FIRST_AUDIO_WAIT_S = 0.4
NEXT_AUDIO_WAIT_S = 0.3
BARGE_IN_MS = 192.0  # voiced audio while speaking that makes the model stop
GAP_SILENCE_S = 0.05  # a unit with no audio ready while speaking
# Duplex requests carry no generation settings; these are the half-duplex defaults.
GENERATION = GenerationOptions(max_new_tokens=SPOKEN_MAX_TOKENS)


class CascadeDuplex(ConversationView, SyncDuplexSession):
    """One duplex conversation; see the module docstring."""

    def __init__(self, stack: ModelStack, turn_taking: TurnTaking | None = None) -> None:
        self._stack = stack
        self._notices = Notices()
        self._tracker = UtteranceTracker(FrameVAD(), turn_taking, stack.turn_judging)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cascade-duplex")
        self._lock = threading.Lock()  # the history, shared with the reply thread
        self._conversation = self._stack.conversation("")
        self._voice = self._unit_voice(stack.tts.resolve_voice(None).espeak)
        self._reply: Reply | None = None
        self._interrupted = False  # barge-in heard in prefill, reported by generate
        self._context_tokens = 0
        self._to_say: list[str] = []  # commentary waiting for the reply in progress
        self.last_asr_ms = 0.0
        self.last_transcript = ""

    def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        self._stop_reply()
        self._tracker.reset()
        self._interrupted = False
        if options.vision:
            self._notices.add("vision is not available on the cascade engine: frames are ignored")
        voice = options.tts_voice or options.llm_voice
        self._voice = self._unit_voice(self._stack.voice(voice, self._notices).espeak)
        with self._lock:
            self._conversation = self._stack.conversation(system_prompt)
            fit = self._conversation.fit(self._stack.llm.count, self._budget())
        self._context_tokens = fit.tokens
        return fit.tokens

    def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        started = time.perf_counter()
        heard = self._tracker.feed(audio)
        reply = self._reply
        if reply is not None and reply.started:
            # Counted over the utterance, not the unit: speech that straddles
            # two units still interrupts.
            if self._tracker.voiced_ms >= BARGE_IN_MS or heard.finished is not None:
                self._stop_reply()
                self._interrupted = True
        elif reply is not None and heard.started and reply.utterance.size:
            # The user went on before we spoke: answer everything they said
            # (commentary, which answers no utterance, is said all the same).
            self._stop_reply()
            if self._tracker.in_speech:
                self._tracker.prepend(reply.utterance)
            elif heard.finished is not None:
                heard.finished = np.concatenate([reply.utterance, heard.finished])
        if heard.finished is not None and self._reply is None:
            self._start_reply(heard.finished)
        return PrefillStats(cost_ms=(time.perf_counter() - started) * 1000)

    def generate(self, force_listen: bool = False) -> DuplexUnit:
        reply = self._reply
        if force_listen and reply is not None:
            self._interrupted = reply.started
            self._stop_reply()
        if self._interrupted:
            self._interrupted = False
            return self._listen(end_of_turn=True)
        if reply is None or force_listen:
            return self._listen()
        piece = reply.take(NEXT_AUDIO_WAIT_S if reply.started else FIRST_AUDIO_WAIT_S)
        if piece is not None and piece.last:
            self._raise_failure(reply)
        if not reply.started and (piece is None or not piece.audio.size):
            if piece is not None:
                self._finish_reply(reply)  # over without a word (nothing was heard)
            return self._listen()  # still thinking
        if piece is None or not piece.audio.size:
            # Speaking, but no audio is ready: all of it went out already (the
            # turn ends here), or the LLM fell behind real time (a moment of
            # silence keeps the turn; "listen" would flush the client's playback).
            gap = np.zeros(round(GAP_SILENCE_S * OUTPUT_RATE), dtype=np.float32)
            piece = Piece(gap, [], last=piece is not None)
        return self._speak(reply, piece)

    def _unit_voice(self, voice: str) -> str:
        """The duplex loop speaks with espeak-ng: each 1 s unit must be ready
        when its second comes, and the Piper voice (~0.2-0.7 s a sentence on
        two busy cores) cannot promise that; half-duplex and chat use it."""
        return self._stack.tts.espeak.default if voice == PIPER else voice

    def update(self, system_prompt: str | None, tts_voice: Voice | None) -> list[str]:
        """Both apply to the next reply: its prompt is rendered afresh each turn."""
        notices = Notices()
        if system_prompt is not None:
            with self._lock:
                self._conversation.system = spoken_system_prompt(system_prompt)
        if tts_voice is not None:
            self._voice = self._unit_voice(self._stack.voice(tts_voice, notices).espeak)
        return notices.items

    def append(self, note: ContextNote) -> int:
        """Instructions and thinking join the conversation as system
        messages (every reply's prompt is rendered from it afresh).
        Commentary is said verbatim, as a reply of its own (SmolLM2 would
        garble a result it was asked to relay): a reply still thinking gives
        way to it, one already speaking finishes first."""
        if note.speakable:
            reply = self._reply
            if reply is not None and not reply.started:
                self._stop_reply()
            self._to_say.append(note.text.strip())
            if self._reply is None:
                self._say_next()
            return 0
        with self._lock:
            self._conversation.add("system", system_text(note))
            self._context_tokens = self._stack.llm.count(self._conversation.messages())
        return self._stack.llm.count([Message("system", system_text(note))])

    def close(self) -> None:
        self._stop_reply()
        self._executor.shutdown(wait=True, cancel_futures=True)

    # --- replies -------------------------------------------------------------

    def _budget(self) -> int:
        return self._stack.llm.n_ctx - self._stack.spoken_budget(GENERATION)

    def _start_reply(self, utterance: np.ndarray) -> None:
        reply = Reply(utterance)
        reply.future = self._executor.submit(self._prepare_reply, reply)
        self._reply = reply

    def _say_next(self) -> None:
        """Start saying the oldest commentary waiting, if any."""
        if not self._to_say:
            return
        reply = Reply(np.zeros(0, dtype=np.float32))
        reply.future = self._executor.submit(self._prepare_said, reply, self._to_say.pop(0))
        self._reply = reply

    def _prepare_said(self, reply: Reply, text: str) -> None:
        """Runs on the session's thread: ``text`` spoken sentence by sentence."""
        try:
            splitter = SentenceSplitter(DUPLEX_FIRST_WORDS)
            for sentence in [*splitter.feed(text + " "), splitter.flush()]:
                if reply.cancel.is_set():
                    return
                if sentence.strip():
                    audio, tts_ms = self._stack.tts.timed(sentence, self._voice)
                    reply.push(SpokenSentence(sentence, audio, 0, 0.0, tts_ms))
        finally:
            reply.finish()

    def _prepare_reply(self, reply: Reply) -> None:
        """Runs on the session's thread: transcribe, then speak sentence by sentence."""
        try:
            transcript = self._stack.asr.transcribe(reply.utterance, self._voice)
            reply.transcript = transcript
            if not transcript.text or reply.cancel.is_set():
                return
            with self._lock:
                reply.fit = self._conversation.fit(
                    self._stack.llm.count, self._budget(), Message("user", transcript.text)
                )
            answer = self._stack.answer(
                self._stack.llm.tokens(reply.fit.messages),
                GENERATION,
                self._stack.spoken_budget(GENERATION),
                self._voice,
                cancel=reply.cancel,
                first_words=DUPLEX_FIRST_WORDS,
            )
            pushed = 0
            try:
                for _ in answer:
                    reply.n_tokens = answer.stats.n_tokens
                    for sentence in answer.stats.sentences[pushed:]:
                        reply.push(sentence)
                    pushed = len(answer.stats.sentences)
            finally:
                answer.close()
        finally:
            reply.finish()

    def _speak(self, reply: Reply, piece: Piece) -> DuplexUnit:
        heard_tokens = 0
        if reply.fit is not None and not reply.committed:
            # The first unit of the answer: the user's turn is now part of the talk.
            reply.committed = True
            heard_tokens = max(0, reply.fit.tokens - self._context_tokens)
            with self._lock:
                self._conversation.commit(reply.fit, reply.fit.messages[-1])
            self.last_asr_ms = reply.transcript.cost_ms if reply.transcript else 0.0
            self.last_transcript = reply.transcript.text if reply.transcript else ""
        if reply.fit is not None:
            self._context_tokens = reply.fit.tokens + reply.n_tokens
        if piece.last:
            self._finish_reply(reply)
        return DuplexUnit(
            is_listen=False,
            text=" ".join(s.text for s in piece.sentences),
            audio=piece.audio,
            end_of_turn=piece.last,
            kv_cache_length=self._context_tokens,
            input_text_tokens=heard_tokens,
            n_tokens=sum(s.n_tokens for s in piece.sentences),
            cost_llm_ms=sum(s.llm_ms for s in piece.sentences),
            cost_tts_ms=sum(s.tts_ms for s in piece.sentences),
        )

    def _listen(self, end_of_turn: bool = False) -> DuplexUnit:
        return DuplexUnit(
            is_listen=True, end_of_turn=end_of_turn, kv_cache_length=self._context_tokens
        )

    def _finish_reply(self, reply: Reply) -> None:
        """The reply is over (spoken, cut off, or empty): record what was said."""
        if self._reply is reply:
            self._reply = None
        said = " ".join(s.text for s in reply.spoken)
        if reply.started and said:
            with self._lock:
                self._conversation.add("assistant", said)
                self._context_tokens = self._stack.llm.count(self._conversation.messages())
        if self._reply is None:
            self._say_next()

    def _stop_reply(self) -> None:
        """Drop the current reply: stop its thread's work, keep what was already said."""
        reply = self._reply
        if reply is None:
            return
        # Not waited for: the thread stops at its next ASR, token or sentence,
        # and the session's next reply queues behind it on the same one-thread
        # executor. Waiting here held a barge-in's unit for a whole sentence's
        # speech (2.7 s on a busy CI machine).
        reply.cancel.set()
        self._finish_reply(reply)

    def _raise_failure(self, reply: Reply) -> None:
        """Raise if the reply's thread failed; call once the reply is over."""
        # The thread marks the reply over just before it returns: this wait is
        # for that return, not for any work.
        exc = reply.future.exception() if reply.future is not None else None
        if exc is not None:
            self._finish_reply(reply)
            log.warning("cascade: duplex reply failed: %s", exc)
            raise EngineError(f"reply failed: {exc}") from exc
