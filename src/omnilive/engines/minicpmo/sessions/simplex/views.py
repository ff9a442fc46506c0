"""The engine's chat and half-duplex views when it has slots: each a
:class:`~omnilive.engines.minicpmo.sessions.simplex.session.SlotSimplex` in a slot of the
shared batch loop, its steps batched with every other live session's.

Their steps are coroutines the worker awaits on its own event loop (as the
duplex view's); an answer is an async generator. A chat takes its slot at its
prefill and gives it back at its close; a half-duplex session holds one from
its prepare to its close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from omnilive.engines.base import ChatSession, EngineError, HalfDuplexSession
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    GenerationOptions,
    HalfDuplexOptions,
    Part,
    TextAudioChunk,
    ToolCall,
    Tools,
    Voice,
)
from omnilive.engines.minicpmo.content import content_of
from omnilive.engines.minicpmo.host import model_errors
from omnilive.engines.minicpmo.runtime.batch import SlotError
from omnilive.engines.minicpmo.sessions.sampling import answer_text
from omnilive.engines.minicpmo.sessions.simplex.history import (
    Entry,
    ToolCallScanner,
    call_text,
    first_difference,
    system_text,
    tools_block,
    wanted,
)
from omnilive.engines.minicpmo.sessions.simplex.session import SlotSimplex

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.sessions.views import SlotEngine

log = logging.getLogger(__name__)


@dataclass
class _Mark:
    """Where a conversation stood (a half-duplex snapshot)."""

    kv_length: int
    state: dict[str, Any]
    ledger: list[Entry]


class _SlotSimplexView:
    """What the chat and half-duplex views share: their slot, their voice,
    their answer streamed to the caller's thread."""

    def __init__(self, model: SlotEngine, default_voice: np.ndarray | None) -> None:
        self._model = model
        self._default_voice = default_voice
        self._session: SlotSimplex | None = None
        self._audio = False
        self._warnings: list[str] = []

    async def _open(self) -> SlotSimplex:
        self._leave()
        model = self._model
        try:
            slot = await model.batch.acquire()
        except SlotError:
            raise EngineError(
                f"every session slot of this GPU is live ({model.batch.steps.cache.slots})"
            ) from None
        self._session = SlotSimplex(
            model.shared,
            model.batch,
            slot,
            suppress_text_only=model.simplex_suppress_text_only,
        )
        return self._session

    def _require(self) -> SlotSimplex:
        if self._session is None:
            raise EngineError("this session has no context yet (prefill or prepare first)")
        return self._session

    def _voice_of(self, voice: Voice | None, want_audio: bool) -> np.ndarray | None:
        """The reference to speak in, or None: the answer is text only."""
        reference = voice.reference if voice is not None else None
        if reference is None:
            reference = self._default_voice
        self._audio = want_audio and self._model.host.settings.audio_output
        if self._audio and reference is None:
            log.warning("no reference voice (request or minicpmo.default_voice): text only")
            self._warnings.append("no reference voice to speak in: the answer is text only")
            self._audio = False
        return reference if self._audio else None

    async def _answer(
        self, generation: GenerationOptions, tools: bool = False
    ) -> AsyncGenerator[TextAudioChunk, None]:
        session = self._require()
        answer = session.answer(
            answer_text(generation),
            generation.max_new_tokens,
            audio=self._audio,
            use_tts_template=self._audio,
            enable_thinking=generation.enable_thinking,
            tools=tools,
        )
        async with aclosing(answer) as pieces:  # left early: the answer stops at its next step
            with model_errors("generate"):
                async for piece in pieces:
                    yield piece

    def _leave(self) -> None:
        """Give the slot back without waiting (from any thread)."""
        session, self._session = self._session, None
        if session is not None:
            try:
                self._model.batch.release_nowait(session.slot)
            except RuntimeError:  # the loop is closed: the slot goes with it
                log.info("minicpmo: slot %d left with its closed loop", session.slot)
            # The engine's counters so far, in the duplex sessions' format
            # (benchmarks/engine_log.py reads them).
            log.info(
                "slot %d released (simplex); busy %s; lane graphs %s",
                session.slot,
                self._model.batch.busy(),
                self._model.shared.lane_graphs(),
            )

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)


async def _with_voice(session: SlotSimplex, reference: np.ndarray | None, work: Any) -> Any:
    """``work`` (a coroutine) while the voice is prepared beside it (a task
    of this session's, awaited before this returns)."""
    preparing = (
        asyncio.create_task(session.set_voice(reference), name=f"minicpmo-voice-{session.slot}")
        if reference is not None
        else None
    )
    try:
        return await work
    finally:
        if preparing is not None:
            await preparing


class SlotChat(_SlotSimplexView, ChatSession):
    """One chat request: its messages prefilled into a fresh slot, one answer."""

    def __init__(self, model: SlotEngine, default_voice: np.ndarray | None) -> None:
        super().__init__(model, default_voice)
        self._generation = GenerationOptions()

    async def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        contents = [content_of(m.parts) for m in messages]  # fail before taking a slot
        session = await self._open()
        reference = self._voice_of(options.voice, options.tts_enabled)
        self._generation = options.generation
        session.answer_room = options.generation.max_new_tokens

        async def messages_in() -> int:
            length = 0
            for index, (message, content) in enumerate(zip(messages, contents, strict=True)):
                length = await session.prefill(
                    message.role,
                    content,
                    last=index == len(messages) - 1,
                    omni_mode=options.omni_mode,
                    max_slice_nums=options.max_slice_nums,
                    use_tts_template=self._audio,
                    enable_thinking=options.generation.enable_thinking,
                )
            return length

        with model_errors("prefill"):
            return await _with_voice(session, reference, messages_in())

    async def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        async with aclosing(self._answer(self._generation)) as pieces:
            async for piece in pieces:
                yield piece

    def close(self) -> None:
        self._leave()


class SlotHalfDuplex(_SlotSimplexView, HalfDuplexSession):
    """System content once, then per turn the user's speech and a streamed
    answer, the context kept in the session's slot across turns. A client
    may edit the conversation (the Realtime API's items), offer tools and
    cut an answer to what was heard: the slot's ledger
    (:mod:`~omnilive.engines.minicpmo.sessions.simplex.history`) says from
    where the context has to be written again."""

    def __init__(self, model: SlotEngine, default_voice: np.ndarray | None) -> None:
        super().__init__(model, default_voice)
        self._options = HalfDuplexOptions()
        self._mark: _Mark | None = None
        self._pending = False
        self._instructions = ""  # the system message's text
        self._system_media: list[Any] = []  # and what else it holds (a voice's audio)
        self._tools = Tools()
        self._ledger: list[Entry] = []
        self._dropped = 0  # the client's turns the slot's window let go since set_history

    @property
    def history_dropped(self) -> int:
        leading = self._ledger[0].span if self._ledger else 0  # text-less, before the first
        return self._dropped + leading

    async def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        content = content_of(system)
        session = await self._open()
        session.window.listener = self._slid
        session.answer_room = options.generation.max_new_tokens
        session.truncation = options.truncation
        self._options = options
        self._instructions = "\n".join(c for c in content if isinstance(c, str))
        self._system_media = [c for c in content if not isinstance(c, str)]
        reference = self._voice_of(options.voice, options.tts_enabled)
        entry = Entry("system", system_text(self._instructions, self._tools), span=0)
        self._dropped = 0
        with model_errors("prefill"):
            return await _with_voice(session, reference, self._rewrite(session, [entry]))

    async def prefill(self, speech: np.ndarray) -> int:
        session = self._require()
        before = session.kv_length
        entry = Entry("speech", speech=np.asarray(speech, dtype=np.float32))
        with model_errors("prefill"):
            after = await self._rewrite(session, [*self._ledger, entry])
        self._pending = True
        return after - before

    async def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        if not self._pending:
            raise EngineError("generate before prefill")
        self._pending = False
        session = self._require()
        answer = Entry("assistant", start=session.kv_length, state=session.turn_state())
        self._ledger.append(answer)
        # Calls are read only when functions are offered: otherwise what
        # the model says is passed on as it is, as the model code does.
        offered = self._tools.offered
        scanner = ToolCallScanner() if offered else None
        async with aclosing(self._answer(self._options.generation, offered)) as pieces:
            async for piece in pieces:
                said, calls = scanner.feed(piece.text) if scanner else (piece.text, [])
                if piece.audio is not None or said or piece.n_tokens:
                    yield TextAudioChunk(text=said, audio=piece.audio, n_tokens=piece.n_tokens)
                for chunk in self._made(answer, said, calls):
                    yield chunk
        said, calls = scanner.finish() if scanner else ("", [])
        if said:
            yield TextAudioChunk(text=said)
        for chunk in self._made(answer, said, calls):
            yield chunk

    @staticmethod
    def _made(answer: Entry, said: str, calls: list[ToolCall]) -> list[TextAudioChunk]:
        """Note what the answer said and called; the calls as chunks."""
        answer.text += said
        answer.calls += tuple((call.name, call.arguments) for call in calls)
        return [TextAudioChunk(tool_call=call) for call in calls]

    async def snapshot(self) -> None:
        session = self._require()
        self._mark = _Mark(session.kv_length, session.turn_state(), list(self._ledger))

    async def rollback(self) -> None:
        self._pending = False
        session, mark = self._session, self._mark
        if session is None or mark is None:
            return
        with model_errors("rollback"):
            await session.crop(mark.kv_length, mark.state)
        self._ledger = list(mark.ledger)

    # --- conversations a client edits (the Realtime API's items) ------------------------

    async def set_history(self, messages: list[ChatMessage]) -> None:
        session = self._require()
        first = messages[0] if messages and messages[0].role == "system" else None
        if first is not None:
            self._instructions = first.text
        entries = wanted(self._ledger, system_text(self._instructions, self._tools), messages)
        self._pending = False
        self._dropped = 0
        with model_errors("prefill"):
            await self._rewrite(session, entries)

    async def respond(self, instructions: str | None = None) -> None:
        session = self._require()
        if instructions:
            with model_errors("prefill"):
                note = Entry("note", instructions, span=0)  # this answer's, no turn of the client's
                await self._rewrite(session, [*self._ledger, note])
        self._pending = True

    async def set_tools(self, tools: Tools) -> None:
        if tools == self._tools:
            return
        self._tools = tools
        if self._session is None or not self._ledger:
            return  # the system message is written with them at prepare
        system = Entry("system", system_text(self._instructions, tools), span=self._ledger[0].span)
        with model_errors("prefill"):
            await self._rewrite(self._session, [system, *self._ledger[1:]])

    async def set_options(self, options: HalfDuplexOptions) -> None:
        session = self._require()
        self._options = options
        session.answer_room = options.generation.max_new_tokens
        session.truncation = options.truncation
        reference = self._voice_of(options.voice, options.tts_enabled)
        if reference is not None:
            with model_errors("prefill"):
                await session.set_voice(reference)

    async def keep_heard(self, text: str) -> bool:
        """The last answer becomes what the user heard of it (with the calls
        it made): the context is cut back to its start and that part written
        again, as text."""
        session = self._session
        last = self._ledger[-1] if self._ledger else None
        if session is None or last is None or last.kind != "assistant":
            return False
        heard = text.strip()
        if heard or last.calls:
            kept = [Entry("assistant", heard, last.calls, span=last.span)]
        else:  # it leaves; the client's turn stays counted, with the one before it
            kept = []
            self._ledger[-2].span += last.span
        with model_errors("prefill"):
            await self._rewrite(session, [*self._ledger[:-1], *kept])
        return True

    async def _rewrite(self, session: SlotSimplex, entries: list[Entry]) -> int:
        """Make the slot hold ``entries``: cut back to the first that is not
        the ledger's own, write the rest; the context length after."""
        same = first_difference(self._ledger, entries)
        if same < len(self._ledger):
            at = self._ledger[same]
            await session.crop(at.start, at.state)
        self._ledger = entries[:same]
        for entry in entries[same:]:
            entry.start, entry.state = session.kv_length, session.turn_state()
            dropped = session.window.dropped_positions
            await self._write(session, entry)
            entry.start -= session.window.dropped_positions - dropped  # the oldest turns left
            self._ledger.append(entry)
        return session.kv_length

    def _slid(self, start: int, kept: int, length: int) -> None:
        """The slot's oldest turns left (:mod:`simplex_window`): the ledger's
        entries from ``start`` up to the one at ``kept`` go, that one takes
        the place of the first gone, the later ones move ``length`` down (a
        snapshot's with them)."""
        ledger = self._ledger
        first = next(i for i, entry in enumerate(ledger) if entry.start >= start)
        keep = next((i for i, entry in enumerate(ledger) if entry.start >= kept), len(ledger))
        gone = ledger[first:keep]
        self._dropped += sum(entry.span for entry in gone)
        if keep < len(ledger):
            ledger[keep].start, ledger[keep].state = ledger[first].start, ledger[first].state
            for entry in ledger[keep + 1 :]:
                entry.start -= length
        del ledger[first:keep]
        mark, self._mark = self._mark, None
        if mark is not None and mark.kv_length >= kept:  # a mark among the gone is no more
            held = [e for e in mark.ledger if all(e is not g for g in gone)]
            self._mark = _Mark(mark.kv_length - length, mark.state, held)

    async def _write(self, session: SlotSimplex, entry: Entry) -> None:
        if entry.kind == "system":  # the tools after the rest, as the chat template has them
            content = [*([self._instructions] if self._instructions else []), *self._system_media]
            block = tools_block(self._tools)
            if block:
                content.append("\n" + block if content else block)
            await session.prefill("system", content, use_tts_template=self._audio)
        elif entry.kind == "speech":
            speech = [entry.speech]
            await session.prefill("user", speech, last=True, use_tts_template=self._audio)
        elif entry.kind == "assistant":
            said = "\n".join(p for p in (entry.text.strip(), call_text(entry.calls)) if p)
            await session.append_message("assistant", said)
        elif entry.kind == "tool":
            await session.append_message("user", f"<tool_response>\n{entry.text}\n</tool_response>")
        else:
            await session.append_message("user" if entry.kind == "user" else "system", entry.text)

    def close(self) -> None:
        self._mark = None
        self._ledger = []
        self._leave()
