"""The conversations of ``omnilive talk``, one per mode.

Each runs a session with two owned tasks beside it: the events (shown,
played) and the microphone (sent). With a file for input, the conversation
ends once the input is over and the model has answered it; with a
microphone, when the user presses Ctrl-C (the session is stopped on the way
out, so the server sees ``stop``) or the server ends the session.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from omnilive.audio import rms
from omnilive.client.audio import INPUT_RATE
from omnilive.client.chat import Chat, as_messages, assistant, user
from omnilive.client.duplex import Duplex
from omnilive.client.errors import SessionClosedError
from omnilive.client.events import (
    ChatDone,
    Chunk,
    Event,
    Generating,
    Paused,
    Prepared,
    Queued,
    QueueUpdate,
    Result,
    Resumed,
    ServerError,
    SessionTimeout,
    Stopped,
    TurnDone,
    VadState,
)
from omnilive.client.half_duplex import HalfDuplex
from omnilive.client.session import Session
from omnilive.client.talk_io import FileSource, Microphone, Sink, Source, StdinLines
from omnilive.client.talk_view import TalkView
from omnilive.client.units import UNIT_SAMPLES
from omnilive.protocol.chat import Message

SETTLE_S = 1.5  # with a file: this long without news, and no answer under way, is the end
ECHO_HOLD_S = 0.8  # the microphone waits this long after playback (spec/half-duplex.md)
VOICED_RMS = 0.01
VOICE_FRAME_S = 0.01  # the resolution of "when the user's voice ended"


def voice_ended_at(block: np.ndarray, sent_at: float) -> float | None:
    """When the last voiced sound of ``block`` was made, if it has any: the
    block ends at ``sent_at`` (it goes out as soon as it is captured), and its
    last 10 ms frame louder than :data:`VOICED_RMS` ends that much earlier."""
    frame = round(VOICE_FRAME_S * INPUT_RATE)
    for end in range(block.size, 0, -frame):
        if rms(block[max(0, end - frame) : end]) > VOICED_RMS:
            return sent_at - (block.size - end) / INPUT_RATE
    return None


@dataclass(frozen=True)
class TalkOptions:
    url: str
    mode: str = "half_duplex"
    key: str | None = None
    token: str | None = None
    voice: str | None = None
    system: str | None = None
    max_wait_s: float = 60.0
    echo_guard: bool = True
    frame: bytes | None = None


def play_piece(view: TalkView, sink: Sink, text: str, audio: np.ndarray | None) -> None:
    """A piece of the model's answer: shown, played, and timed."""
    view.says(text)
    if audio is not None and audio.size:
        sink.play(audio)
        view.sound()


class Conversation(abc.ABC):
    """A streaming session (half-duplex or duplex) between a source and a sink."""

    def __init__(self, options: TalkOptions, view: TalkView, source: Source, sink: Sink) -> None:
        self.options = options
        self.view = view
        self.source = source
        self.sink = sink
        self.activity = asyncio.Event()  # any event arrived
        self.input_finished = asyncio.Event()
        self.session = self.open_session()  # opened by run()

    @abc.abstractmethod
    def open_session(self) -> Session: ...

    @abc.abstractmethod
    def on_event(self, event: Event) -> None: ...

    @abc.abstractmethod
    async def send(self, block: np.ndarray) -> None: ...

    @abc.abstractmethod
    async def answered(self) -> None:
        """Return once the model has answered what the input file said."""

    async def run(self) -> str:
        """Talk until done; returns how the session ended."""
        session = self.session
        await session.open()
        try:
            async with asyncio.TaskGroup() as tasks:
                events = tasks.create_task(self._events(), name="talk:events")
                ready = await session.ready()
                self.view.line(f"connected: {self.options.mode} {_describe(ready)}")
                microphone = tasks.create_task(self._microphone(), name="talk:microphone")
                finished = tasks.create_task(self._finished(), name="talk:finish")
                await asyncio.wait([events, finished], return_when=asyncio.FIRST_COMPLETED)
                microphone.cancel()
                finished.cancel()
                if not events.done():
                    await session.stop()
        finally:
            await session.close()
        return self.ending()

    def ending(self) -> str:
        """How the session ended, as the server said it."""
        return _ending(self.session.ending)

    async def _events(self) -> None:
        async for event in self.session:
            self.activity.set()
            if isinstance(event, Queued | QueueUpdate):
                self.view.queued(self.session.queue)
            elif isinstance(event, ServerError):
                self.view.line(f"error: {event.code}: {event.message}")
            else:
                self.on_event(event)

    async def _microphone(self) -> None:
        try:
            async for block in self.source.blocks():
                if self.source.input_done:
                    self.input_finished.set()
                await self.send(block)
        except SessionClosedError:
            return  # the session ended meanwhile: the events tell how
        self.input_finished.set()

    async def _finished(self) -> None:
        if self.source.live:
            await asyncio.Event().wait()  # until Ctrl-C or the session ends
        await self.input_finished.wait()
        try:
            async with asyncio.timeout(self.options.max_wait_s):
                await self.answered()
        except TimeoutError:
            self.view.line(f"no answer within {self.options.max_wait_s:.0f} s of the input's end")

    async def quiet(self, busy: Callable[[], bool]) -> None:
        """Until ``SETTLE_S`` pass with no event and nothing ``busy``."""
        while True:
            self.activity.clear()
            try:
                async with asyncio.timeout(SETTLE_S):
                    await self.activity.wait()
            except TimeoutError:
                if not busy():
                    return


def _describe(ready: Event) -> str:
    if isinstance(ready, Prepared):
        return f"session {ready.session_id} (recording {ready.recording_session_id})"
    return type(ready).__name__


def _ending(event: Event | None) -> str:
    if isinstance(event, Stopped):
        return "stopped"
    if isinstance(event, SessionTimeout):
        return f"timeout ({event.reason or 'inactivity'})"
    return "closed"


class HalfDuplexTalk(Conversation):
    _hold_until = 0.0  # monotonic time before which the microphone is held
    # When the user's voice last ended: latency is what they live through, from
    # then to the first sound, not from the server's decision that they stopped.
    _voice_ended: float | None = None

    def open_session(self) -> HalfDuplex:
        o = self.options
        return HalfDuplex(o.url, system_prompt=o.system, voice=o.voice, key=o.key, token=o.token)

    def on_event(self, event: Event) -> None:
        if isinstance(event, VadState):
            self.view.hearing(event.speaking)
            if not event.speaking:
                self.view.user_turn_ended(self._voice_ended)
        elif isinstance(event, Generating):
            self.view.line(f"[thinking about {event.speech_duration_ms / 1000:.1f} s of speech]")
        elif isinstance(event, Chunk):
            play_piece(self.view, self.sink, event.text, event.audio)
        elif isinstance(event, TurnDone):
            self.view.turn_done()

    async def send(self, block: np.ndarray) -> None:
        if self.source.live and self.options.echo_guard and self._holding():
            return
        assert isinstance(self.session, HalfDuplex)
        now = time.monotonic()
        await self.session.send(block)
        self._voice_ended = voice_ended_at(block, now) or self._voice_ended

    def _holding(self) -> bool:
        """Hold the microphone while the answer plays, and a little after
        (else the model hears itself)."""
        assert isinstance(self.session, HalfDuplex)
        now = time.monotonic()
        if self.session.answering or self.sink.remaining_s() > 0:
            self._hold_until = now + ECHO_HOLD_S
        return now < self._hold_until

    async def answered(self) -> None:
        assert isinstance(self.session, HalfDuplex)
        session = self.session
        await self.quiet(lambda: session.answering)


class DuplexTalk(Conversation):
    def __init__(self, options: TalkOptions, view: TalkView, source: Source, sink: Sink) -> None:
        super().__init__(options, view, source, sink)
        self._speaking = False
        self._hold_until = 0.0
        self.turn_over = asyncio.Event()  # a model turn ended after the input did

    def open_session(self) -> Duplex:
        o = self.options
        mode: Literal["audio", "omni"] = "omni" if o.mode == "omni" else "audio"
        return Duplex(o.url, mode=mode, system_prompt=o.system, voice=o.voice,
                      tts_voice=o.voice, key=o.key, token=o.token)  # fmt: skip

    def on_event(self, event: Event) -> None:
        if isinstance(event, Result):
            if not event.is_listen:
                self._speaking = True
                play_piece(self.view, self.sink, event.text, event.audio)
                if event.end_of_turn:
                    self._turn_ended()
            elif self._speaking:  # a listen cut the turn short: drop the rest of its speech
                self.sink.flush()
                self._turn_ended()
        elif isinstance(event, Paused | Resumed):
            self.view.line(f"[{type(event).__name__.lower()}]")

    def _turn_ended(self) -> None:
        self._speaking = False
        self.view.turn_done()
        if self.input_finished.is_set():
            self.turn_over.set()

    async def send(self, block: np.ndarray) -> None:
        assert isinstance(self.session, Duplex)
        now = time.monotonic()
        if self.source.live and self.options.echo_guard:
            if self.sink.remaining_s() > 0:
                self._hold_until = now + ECHO_HOLD_S
            if now < self._hold_until:
                block = np.zeros_like(block)  # the unit loop needs audio every second
        ended = voice_ended_at(block, now)
        if ended is not None:
            self.view.user_turn_ended(ended)
        frames: list[bytes] = []
        completes_unit = self.session.units.pending_samples + block.size >= UNIT_SAMPLES
        if self.options.frame and completes_unit:
            frames = [self.options.frame]  # one frame per unit: a still camera
        await self.session.send(block, frames)

    async def answered(self) -> None:
        await self.turn_over.wait()


class ChatTalk:
    """Turn-based: a question (the input file, or typed or spoken ones), an answer."""

    def __init__(self, options: TalkOptions, view: TalkView, source: Source, sink: Sink) -> None:
        self.options = options
        self.view = view
        self.source = source
        self.sink = sink
        self.chat = Chat(options.url, key=options.key, token=options.token)

    def ending(self) -> str:
        return "closed"  # a chat request has no stop: its socket closes

    async def run(self) -> str:
        if isinstance(self.source, FileSource):
            await self.ask([user(self.source.speech)])
            return "done"
        history: list[Message] = []
        lines = StdinLines()
        try:
            while True:
                self.view.line("you (type a question, or press Enter to speak):")
                typed = await lines.next()
                if typed is None:
                    return "done"
                if typed.strip():
                    question = user(typed.strip())
                else:
                    question = user(await self.record(lines.next))
                answer = await self.ask([*history, question])
                history += [question, assistant(answer)]
        finally:
            lines.close()

    async def record(self, enter: Callable[[], Awaitable[str | None]]) -> np.ndarray:
        """The microphone until the user presses Enter again."""
        assert isinstance(self.source, Microphone)
        self.source.drain()
        self.view.line("[recording: press Enter to send]")
        blocks: list[np.ndarray] = []

        async def collect() -> None:
            async for block in self.source.blocks():
                blocks.append(block)

        async with asyncio.TaskGroup() as tasks:
            collector = tasks.create_task(collect(), name="talk:record")
            await enter()
            collector.cancel()
        audio = np.concatenate(blocks) if blocks else np.zeros(INPUT_RATE // 10, np.float32)
        self.view.line(f"[heard {audio.size / INPUT_RATE:.1f} s]")
        return audio

    async def ask(self, conversation: list[Message]) -> str:
        o = self.options
        messages = as_messages(conversation, o.system)
        self.view.user_turn_ended()
        async with self.chat.request(messages, voice=o.voice) as reply:
            async for event in reply:
                if isinstance(event, Queued | QueueUpdate):
                    self.view.queued(reply.queue)
                elif isinstance(event, Chunk):
                    play_piece(self.view, self.sink, event.text, event.audio)
                elif isinstance(event, ChatDone):
                    if event.audio is not None:  # not streamed: all of it comes now
                        play_piece(self.view, self.sink, event.text, event.audio)
                    self.view.turn_done()
                    return event.text
        return ""


CONVERSATIONS: dict[str, type[Conversation] | type[ChatTalk]] = {
    "half_duplex": HalfDuplexTalk,
    "duplex": DuplexTalk,
    "omni": DuplexTalk,
    "chat": ChatTalk,
}
