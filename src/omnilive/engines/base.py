"""The engine interface: a model (or cascade of models) behind three views.

A view's steps (a prefill, an answer, a unit) may be slow, and the event
loop must go on reading control messages while one runs: they are
coroutines (``generate`` an async generator), and the worker awaits them.
An engine whose work is already off the loop (the GPU engine's batch loop
and lanes) implements these views and needs no thread per session. An
engine whose steps are blocking calls implements the synchronous views of
:mod:`omnilive.engines.sync_views` instead; the worker runs their methods
on the session's lane, one step at a time, through one adapter. A session
object holds one conversation's state; an engine with
``capabilities.slots > 1`` hands out several at once. What the views take
and return (messages, options, answers' chunks, duplex units) is plain
data, in :mod:`omnilive.engines.messages`.

Audio in is float32 mono at 16 kHz; audio out is float32 mono at 24 kHz.
"""

from __future__ import annotations

import abc
import dataclasses
import time
import types
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from omnilive.engines.appends import ContextNote
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    ContextWindow,
    DuplexOptions,
    DuplexUnit,
    HalfDuplexOptions,
    Modality,
    Part,
    PrefillStats,
    TextAudioChunk,
    Tools,
    UnitInput,
    Voice,
)
from omnilive.engines.steps import StepLoop

if TYPE_CHECKING:  # sync_views builds on this module's views
    from omnilive.engines.sync_views import (
        SyncChatSession,
        SyncDuplexSession,
        SyncHalfDuplexSession,
    )

T = TypeVar("T")


class EngineError(Exception):
    """A model step failed; the session decides whether it can go on."""


class EngineUnavailable(EngineError):
    """The engine cannot load as configured (a missing checkpoint, package,
    GPU or CPU feature): starting it again will not help, so it is not retried."""


class CapabilityError(EngineError):
    """The request needs something this engine does not have."""

    def __init__(self, engine: str, missing: str, detail: str = "") -> None:
        self.engine = engine
        self.missing = missing
        message = f"engine '{engine}' lacks the capability '{missing}'"
        super().__init__(f"{message}: {detail}" if detail else message)


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do; advertised by workers and shown to clients."""

    input_modalities: frozenset[Modality]
    audio_output: bool
    voice_cloning: bool
    context_length: int
    slots: int = 1
    # How a duplex session's context slides by default (None: no duplex
    # window; a session's prepare may ask for its own).
    context_window: ContextWindow | None = None

    @property
    def vision(self) -> bool:
        return Modality.IMAGE in self.input_modalities

    def to_dict(self) -> dict[str, object]:
        window = self.context_window
        return {
            "input_modalities": sorted(m.value for m in self.input_modalities),
            "audio_output": self.audio_output,
            "voice_cloning": self.voice_cloning,
            "vision": self.vision,
            "context_length": self.context_length,
            "slots": self.slots,
            "context_window": None if window is None else dataclasses.asdict(window),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Capabilities:
        return cls(
            # JSON from the wire, its shape checked by the worker that sent it.
            input_modalities=frozenset(Modality(m) for m in data["input_modalities"]),  # type: ignore[attr-defined]  # a list of str in to_dict's JSON
            audio_output=bool(data["audio_output"]),
            voice_cloning=bool(data["voice_cloning"]),
            context_length=int(data["context_length"]),  # type: ignore[call-overload]  # an int in to_dict's JSON
            slots=int(data.get("slots", 1)),  # type: ignore[call-overload]  # an int in to_dict's JSON
            context_window=_window_of(data.get("context_window")),
        )


def _window_of(data: object) -> ContextWindow | None:
    if not isinstance(data, dict):
        return None
    return ContextWindow.of(types.SimpleNamespace(**data))


# --- views -------------------------------------------------------------------


class Interruptible(Iterator[T]):
    """An answer's chunks whose producer can be told, from any thread, that
    their reader left: :meth:`interrupt` makes the engine stop at its next
    step instead of finishing the piece in hand (and its ``next()`` then
    ends the iteration). The engine's step lanes call it when a reader
    leaves a stream early."""

    def __init__(self, items: Iterator[T], interrupt: Callable[[], None]) -> None:
        self._items = items
        self._interrupt = interrupt

    def __next__(self) -> T:
        return next(self._items)

    def interrupt(self) -> None:
        self._interrupt()

    def close(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            close()


class ViewBasics:
    """What every view has, whether its steps are coroutines or plain
    methods run on a lane (:mod:`omnilive.engines.sync_views`): a release,
    and what the runners read between steps, on the event loop."""

    def close(self) -> None:
        """Release the session's state (caches, GPU memory). Not a step: the
        worker runs it as the session lane's last step, from a thread."""

    @property
    def warnings(self) -> list[str]:
        """Things the engine could not do as asked (e.g. clone a voice) but
        answered anyway; runners pass them on to the client."""
        return []


class HalfDuplexBasics(ViewBasics):
    """What a half-duplex view tells between its steps."""

    @property
    def judges_words(self) -> bool:
        """Whether :meth:`HalfDuplexSession.end_of_turn` gives an opinion (from
        the words it heard): the words do not change with more silence, so the
        worker reads them at a shorter silence than it waits before judging by
        sound alone."""
        return False

    @property
    def turn_timings(self) -> dict[str, float]:
        """Optional stage timings of the last turn in ms (e.g. ``asr_ms``), for
        benchmarks and logs; runners add them to ``turn_done``."""
        return {}

    @property
    def transcript(self) -> str | None:
        """What the user said in the last prefill, when the engine
        transcribes speech on its way (the cascade's Whisper); else None."""
        return None

    @property
    def history_dropped(self) -> int | None:
        """How many of the conversation's turns, oldest first, the context
        no longer holds (its truncation let them go), counted since the last
        :meth:`HalfDuplexSession.prepare` or
        :meth:`HalfDuplexSession.set_history`. A turn is each message
        ``set_history`` gave after the system message (one with nothing the
        engine keeps counts too), each :meth:`HalfDuplexSession.prefill` and
        each answer (all it said and called); ``respond``'s instructions are
        none. Only the oldest leave, so the count says which ones: the
        Realtime items the model no longer sees. None: the engine does not say."""
        return None


class ChatSession(ViewBasics, abc.ABC):
    """Stateless turn-based chat: one prefill of all messages, then generation."""

    @abc.abstractmethod
    async def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        """Encode every message; returns the input token count."""

    @abc.abstractmethod
    def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        """Stream the answer (an async generator). Each item should come soon
        (a token or a sentence); a reader that leaves closes it, and the
        engine stops at its next step."""


class HalfDuplexSession(HalfDuplexBasics, abc.ABC):
    """Voice turns with context kept across turns of one session."""

    @abc.abstractmethod
    async def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        """Prefill the system content; returns the prompt length in tokens."""

    @abc.abstractmethod
    async def prefill(self, speech: np.ndarray) -> int:
        """Add one user speech segment (16 kHz); returns tokens added."""

    @abc.abstractmethod
    def generate(self) -> AsyncGenerator[TextAudioChunk, None]:
        """Stream the answer to the last speech segment (see
        :meth:`ChatSession.generate`)."""

    async def hear(self, speech_so_far: np.ndarray, paused: bool) -> None:
        """Optional early work while the user is still speaking.

        Called with the current turn's speech so far (16 kHz) whenever new
        speech arrives; ``paused`` is True when the VAD has just heard
        silence after speech, so the turn may be over. An engine may
        transcribe (and, when paused, start answering) ahead of time. A later
        :meth:`prefill` whose speech starts with the same samples may reuse that
        work; otherwise the engine must discard it.
        """

    async def end_of_turn(self, speech: np.ndarray) -> float | None:
        """The engine's own estimate (0–1), from the words it understood in
        ``speech`` (the turn so far, its silence included), that the user has
        finished; None: no opinion, the worker's audio model judges alone.
        Called at each of the VAD's turn checks; it may wait briefly for the
        early work of :meth:`hear`."""
        return None

    async def keep_heard(self, text: str) -> bool:
        """Cut the last answer in the context to ``text``, the part the user
        heard (docs/resume.md); False when the engine cannot roll its context
        back (it then keeps the whole answer)."""
        return False

    @abc.abstractmethod
    async def snapshot(self) -> None:
        """Remember the context as it is now (before a turn)."""

    @abc.abstractmethod
    async def rollback(self) -> None:
        """Restore the context to the last snapshot (after a failed turn)."""

    # --- conversations a client edits (the Realtime API's items) ---------------
    # Optional: an engine without them refuses with CapabilityError, which the
    # session reports as an error and goes on.

    async def set_history(self, messages: list[ChatMessage]) -> None:
        """Replace the conversation (system message first) with ``messages``:
        text, and tool calls with their results. Speech already in the
        context is given as its transcript."""
        raise CapabilityError(type(self).__name__, "conversation items")

    async def respond(self, instructions: str | None = None) -> None:
        """Make :meth:`generate` answer the conversation as it stands, with
        no new speech; ``instructions`` are added for this answer only."""
        raise CapabilityError(type(self).__name__, "responses without speech")

    async def set_tools(self, tools: Tools) -> None:
        """Offer functions to the model from the next answer on."""
        if tools.functions:
            raise CapabilityError(type(self).__name__, "tools")

    async def set_options(self, options: HalfDuplexOptions) -> None:
        """New generation options (speech on or off, voice, length) from the
        next answer on, the conversation kept."""
        raise CapabilityError(type(self).__name__, "session updates")


class DuplexSession(ViewBasics, abc.ABC):
    """The per-second unit loop of full duplex: a unit (its prefill, then its
    generate), then its finalize."""

    @abc.abstractmethod
    async def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        """Reset and prefill the system prompt; returns the prompt length."""

    @abc.abstractmethod
    async def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        """Feed one unit of audio (16 kHz) and JPEG frames."""

    @abc.abstractmethod
    async def generate(self, force_listen: bool = False) -> DuplexUnit:
        """Decide to listen or speak for this unit."""

    async def unit(self, given: UnitInput) -> tuple[PrefillStats, DuplexUnit]:
        """One unit, the worker's one entry: :meth:`prefill`, then
        :meth:`generate`. The stats' ``cost_ms`` is the prefill's part as
        this caller saw it. An engine that runs a unit best as one request
        (its threads pass the unit along without returning to the event
        loop in between) overrides it."""
        started = time.perf_counter()
        stats = await self.prefill(given.audio, given.frames, given.max_slice_nums)
        cost_ms = (time.perf_counter() - started) * 1000
        result = await self.generate(given.force_listen)
        return dataclasses.replace(stats, cost_ms=cost_ms), result

    async def finalize(self) -> None:
        """Bookkeeping after a unit's result is sent (deferred finalize)."""

    async def update(self, system_prompt: str | None, tts_voice: Voice | None) -> list[str]:
        """Change the instructions or the voice mid-session, from the next turn
        on, where the engine can; returns what it could not change (warnings)."""
        return unchanged_by_update(system_prompt, tts_voice)

    async def append(self, note: ContextNote) -> int:
        """Write ``note`` into the context, between two units (the worker
        calls it after one unit's finalize, before the next one's prefill);
        returns the tokens it added. Commentary is for the model to say
        (the Live API's appends: :mod:`omnilive.engines.appends`)."""
        raise CapabilityError(type(self).__name__, "text appended to the context")


def unchanged_by_update(system_prompt: str | None, tts_voice: Voice | None) -> list[str]:
    """What :meth:`DuplexSession.update` answers where the engine changes nothing."""
    unchanged = []
    if system_prompt is not None:
        unchanged.append("this engine keeps the session's instructions until it ends")
    if tts_voice is not None:
        unchanged.append("this engine keeps the session's voice until it ends")
    return unchanged


ProgressCallback = Callable[[str, float], None]
"""``progress(stage, fraction)``, fraction in [0, 1]."""


class Engine(abc.ABC):
    """A loaded model behind the chat, half-duplex and duplex views."""

    name: str
    capabilities: Capabilities

    @abc.abstractmethod
    def load(self, progress: ProgressCallback) -> None:
        """Load weights and warm up. Called once, off the event loop."""

    # A view, in either form: the worker runs a synchronous one's steps on
    # the session's lane (sync_views.on_lane).
    @abc.abstractmethod
    def open_chat(self) -> ChatSession | SyncChatSession: ...

    @abc.abstractmethod
    def open_half_duplex(self) -> HalfDuplexSession | SyncHalfDuplexSession: ...

    @abc.abstractmethod
    def open_duplex(self) -> DuplexSession | SyncDuplexSession: ...

    def default_voice(self) -> Voice | None:
        """The voice used when a request names none."""
        return None

    def step_loop(self) -> StepLoop:
        """The loop that runs this engine's synchronous steps: one thread per slot. An
        engine that batches its sessions' steps returns a loop of its own."""
        return StepLoop(self.capabilities.slots, name=self.name)

    def gpu_id(self) -> int | None:
        """The GPU this engine runs on, as ``nvidia-smi`` numbers it (None: the CPU)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free everything the engine holds."""

    def require(self, needed: set[Modality]) -> None:
        """Raise :class:`CapabilityError` if ``needed`` is not all supported."""
        missing = sorted(m.value for m in needed - self.capabilities.input_modalities)
        if missing:
            raise CapabilityError(self.name, f"{missing[0]} input", "this engine cannot take it")
