"""The views of an engine whose steps are blocking calls, and the one adapter
that makes them the worker's views (:mod:`omnilive.engines.base`).

A synchronous engine (the scripted one, the cascade, MiniCPM-o's reference
code) implements :class:`SyncChatSession`, :class:`SyncHalfDuplexSession`
or :class:`SyncDuplexSession`; :func:`on_lane` wraps such a view so that
each of its methods runs as one step on the session's :class:`Lane`: in the
order the session awaits them, one at a time, off the event loop, its
answers streamed by :meth:`Lane.stream` (an :class:`Interruptible`
answer is interrupted when its reader leaves). What a view tells between
steps (its warnings, timings, transcript) and its close are read as they
are. The methods' meanings are the async views' (see there).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Iterator
from typing import Generic, TypeVar, overload

import numpy as np

from omnilive.engines.appends import ContextNote
from omnilive.engines.base import (
    CapabilityError,
    ChatSession,
    DuplexSession,
    HalfDuplexBasics,
    HalfDuplexSession,
    ViewBasics,
    unchanged_by_update,
)
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    DuplexOptions,
    DuplexUnit,
    HalfDuplexOptions,
    Part,
    PrefillStats,
    TextAudioChunk,
    Tools,
    Voice,
)
from omnilive.engines.steps import Lane

V = TypeVar("V", bound=ViewBasics)


class SyncChatSession(ViewBasics, abc.ABC):
    """:class:`~omnilive.engines.base.ChatSession` as blocking calls."""

    @abc.abstractmethod
    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int: ...

    @abc.abstractmethod
    def generate(self) -> Iterator[TextAudioChunk]:
        """The answer's chunks, each ``next()`` short; the iterator may be
        :class:`~omnilive.engines.base.Interruptible`."""


class SyncHalfDuplexSession(HalfDuplexBasics, abc.ABC):
    """:class:`~omnilive.engines.base.HalfDuplexSession` as blocking calls."""

    @abc.abstractmethod
    def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int: ...

    @abc.abstractmethod
    def prefill(self, speech: np.ndarray) -> int: ...

    @abc.abstractmethod
    def generate(self) -> Iterator[TextAudioChunk]:
        """See :meth:`SyncChatSession.generate`."""

    def hear(self, speech_so_far: np.ndarray, paused: bool) -> None:
        """Optional early work while the user is still speaking."""

    def end_of_turn(self, speech: np.ndarray) -> float | None:
        return None

    def keep_heard(self, text: str) -> bool:
        return False

    @abc.abstractmethod
    def snapshot(self) -> None: ...

    @abc.abstractmethod
    def rollback(self) -> None: ...

    def set_history(self, messages: list[ChatMessage]) -> None:
        raise CapabilityError(type(self).__name__, "conversation items")

    def respond(self, instructions: str | None = None) -> None:
        raise CapabilityError(type(self).__name__, "responses without speech")

    def set_tools(self, tools: Tools) -> None:
        if tools.functions:
            raise CapabilityError(type(self).__name__, "tools")

    def set_options(self, options: HalfDuplexOptions) -> None:
        raise CapabilityError(type(self).__name__, "session updates")


class SyncDuplexSession(ViewBasics, abc.ABC):
    """:class:`~omnilive.engines.base.DuplexSession` as blocking calls: a
    unit is its prefill, then its generate (two steps on the lane)."""

    @abc.abstractmethod
    def prepare(self, system_prompt: str, options: DuplexOptions) -> int: ...

    @abc.abstractmethod
    def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats: ...

    @abc.abstractmethod
    def generate(self, force_listen: bool = False) -> DuplexUnit: ...

    def finalize(self) -> None:
        """Bookkeeping after a unit's result is sent (deferred finalize)."""

    def update(self, system_prompt: str | None, tts_voice: Voice | None) -> list[str]:
        return unchanged_by_update(system_prompt, tts_voice)

    def append(self, note: ContextNote) -> int:
        raise CapabilityError(type(self).__name__, "text appended to the context")


# --- the adapter ------------------------------------------------------------------


class _OnLane(Generic[V]):
    """A synchronous view whose steps run on ``lane``; what it tells between
    steps, and its close, are the view's own."""

    def __init__(self, view: V, lane: Lane) -> None:
        self.view = view
        self.lane = lane

    def close(self) -> None:
        self.view.close()

    @property
    def warnings(self) -> list[str]:
        return self.view.warnings


class LaneChat(_OnLane[SyncChatSession], ChatSession):
    async def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        return await self.lane.run(self.view.prefill, messages, options)

    def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        return self.lane.stream(self.view.generate)


class LaneHalfDuplex(_OnLane[SyncHalfDuplexSession], HalfDuplexSession):
    @property
    def judges_words(self) -> bool:
        return self.view.judges_words

    @property
    def turn_timings(self) -> dict[str, float]:
        return self.view.turn_timings

    @property
    def transcript(self) -> str | None:
        return self.view.transcript

    @property
    def history_dropped(self) -> int | None:
        return self.view.history_dropped

    async def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        return await self.lane.run(self.view.prepare, system, options)

    async def prefill(self, speech: np.ndarray) -> int:
        return await self.lane.run(self.view.prefill, speech)

    def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        return self.lane.stream(self.view.generate)

    async def hear(self, speech_so_far: np.ndarray, paused: bool) -> None:
        await self.lane.run(self.view.hear, speech_so_far, paused)

    async def end_of_turn(self, speech: np.ndarray) -> float | None:
        return await self.lane.run(self.view.end_of_turn, speech)

    async def keep_heard(self, text: str) -> bool:
        return await self.lane.run(self.view.keep_heard, text)

    async def snapshot(self) -> None:
        await self.lane.run(self.view.snapshot)

    async def rollback(self) -> None:
        await self.lane.run(self.view.rollback)

    async def set_history(self, messages: list[ChatMessage]) -> None:
        await self.lane.run(self.view.set_history, messages)

    async def respond(self, instructions: str | None = None) -> None:
        await self.lane.run(self.view.respond, instructions)

    async def set_tools(self, tools: Tools) -> None:
        await self.lane.run(self.view.set_tools, tools)

    async def set_options(self, options: HalfDuplexOptions) -> None:
        await self.lane.run(self.view.set_options, options)


class LaneDuplex(_OnLane[SyncDuplexSession], DuplexSession):
    """A unit is :meth:`DuplexSession.unit`'s default: the view's prefill,
    then its generate, each a step of the lane, so that the prefill's share
    is what the worker saw it take, queueing included."""

    async def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        return await self.lane.run(self.view.prepare, system_prompt, options)

    async def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        return await self.lane.run(self.view.prefill, audio, frames, max_slice_nums)

    async def generate(self, force_listen: bool = False) -> DuplexUnit:
        return await self.lane.run(self.view.generate, force_listen)

    async def finalize(self) -> None:
        await self.lane.run(self.view.finalize)

    async def update(self, system_prompt: str | None, tts_voice: Voice | None) -> list[str]:
        return await self.lane.run(self.view.update, system_prompt, tts_voice)

    async def append(self, note: ContextNote) -> int:
        return await self.lane.run(self.view.append, note)


@overload
def on_lane(view: ChatSession | SyncChatSession, lane: Lane) -> ChatSession: ...
@overload
def on_lane(view: HalfDuplexSession | SyncHalfDuplexSession, lane: Lane) -> HalfDuplexSession: ...
@overload
def on_lane(view: DuplexSession | SyncDuplexSession, lane: Lane) -> DuplexSession: ...
def on_lane(view: ViewBasics, lane: Lane) -> ViewBasics:
    """The worker's view of an engine's ``view``: a synchronous one's steps
    on ``lane``; an async one as it is (its steps are already off the loop)."""
    match view:
        case SyncChatSession():
            return LaneChat(view, lane)
        case SyncHalfDuplexSession():
            return LaneHalfDuplex(view, lane)
        case SyncDuplexSession():
            return LaneDuplex(view, lane)
    return view
