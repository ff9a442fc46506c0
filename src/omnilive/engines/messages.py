"""What an engine's sessions are given and give back: decoded message
content, the options of each view, streamed answers and duplex units.

Plain dataclasses, built by the workers and the engines alike; the views
that take and return them are in :mod:`omnilive.engines.base`. Audio in is
float32 mono at 16 kHz; audio out is float32 mono at 24 kHz.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np


class Modality(StrEnum):
    TEXT = "text"
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


# --- decoded content -------------------------------------------------------


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    data: bytes  # an encoded image (JPEG, PNG, ...), already checked to decode


@dataclass(frozen=True, eq=False)
class AudioPart:
    samples: np.ndarray  # float32, 16 kHz


@dataclass(frozen=True)
class VideoPart:
    data: bytes  # a video file
    stack_frames: int = 1


Part = TextPart | ImagePart | AudioPart | VideoPart


@dataclass(frozen=True)
class ToolCall:
    """A function the model asked to call: ``arguments`` is its JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant | tool
    parts: tuple[Part, ...]
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool message answers this call
    item_id: str | None = None  # the client's conversation item, where it has one

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


def modalities_of(messages: list[ChatMessage]) -> set[Modality]:
    kinds = {
        TextPart: Modality.TEXT,
        ImagePart: Modality.IMAGE,
        AudioPart: Modality.AUDIO,
        VideoPart: Modality.VIDEO,
    }
    return {kinds[type(p)] for m in messages for p in m.parts}


# --- options ----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Voice:
    """Who speaks: a reference recording to clone, or a named built-in voice."""

    reference: np.ndarray | None = None  # float32, 16 kHz
    name: str | None = None
    language: str | None = None


@dataclass(frozen=True)
class GenerationOptions:
    """How an answer's text is chosen. ``do_sample=False`` (or a temperature
    of 0) is greedy decoding: every engine honours it."""

    max_new_tokens: int = 512
    do_sample: bool = True
    temperature: float = 0.7
    top_p: float = 0.8
    length_penalty: float = 1.0
    enable_thinking: bool = False

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0


@dataclass(frozen=True)
class ChatOptions:
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    tts_enabled: bool = True
    tts_mode: str = "default"
    voice: Voice | None = None
    max_slice_nums: int | None = None
    use_image_id: bool = True
    omni_mode: bool = False


@dataclass(frozen=True)
class HistoryTruncation:
    """How a conversation makes room when its history (what follows the
    instructions) passes its limit: the OpenAI Realtime API's
    ``session.truncation``. The oldest whole turns leave first; the
    instructions and the newest message stay.

    ``enabled`` False ("disabled"): nothing ever leaves, and a message or an
    answer that does not fit fails (:mod:`omnilive.engines.truncation`). ``limit_tokens``
    (``token_limits.post_instructions``): the history's own limit, under the
    one the context sets (None: the context's, less the answer's room).
    ``retention_ratio``: once past the limit, turns leave until the history
    is at most that share of it, so that a long conversation slides now and
    then rather than at every turn (None: only as much as the message needs)."""

    enabled: bool = True
    limit_tokens: int | None = None
    retention_ratio: float | None = None


@dataclass(frozen=True)
class HalfDuplexOptions:
    generation: GenerationOptions = field(
        default_factory=lambda: GenerationOptions(max_new_tokens=256, length_penalty=1.1)
    )
    tts_enabled: bool = True
    voice: Voice | None = None
    truncation: HistoryTruncation = field(default_factory=HistoryTruncation)


class WindowMode(StrEnum):
    """How a duplex session's context makes room (MiniCPM-o's own modes)."""

    OFF = "off"  # a fixed context: the session ends ``context_full`` when it fills
    BASIC = "basic"  # past ``high_tokens``, the oldest units leave until ``low_tokens``
    CONTEXT = "context"  # past ``max_units``, the oldest leave, their words kept in a note


@dataclass(frozen=True)
class ContextWindow:
    """A duplex session's sliding context, as the model code's
    ``DuplexWindowConfig`` has it. The system prompt always stays. ``basic``
    drops whole units, oldest first, once the context passes
    ``high_tokens``, until it is at most ``low_tokens``; ``context`` keeps at
    most ``max_units`` units and folds what the model said in the dropped
    ones into a "previous" note after the system prompt (at most
    ``previous_max_tokens`` of it, the newest)."""

    mode: WindowMode = WindowMode.BASIC
    high_tokens: int = 4000
    low_tokens: int = 3500
    previous_max_tokens: int = 500
    max_units: int = 24

    @classmethod
    def of(cls, settings: Any) -> ContextWindow:
        """From a ``duplex_window`` settings section (or any object with its fields)."""
        return cls(
            WindowMode(settings.mode),
            settings.high_tokens,
            settings.low_tokens,
            settings.previous_max_tokens,
            settings.max_units,
        )


@dataclass(frozen=True)
class DuplexOptions:
    llm_voice: Voice | None = None  # embedded in the system prompt
    tts_voice: Voice | None = None  # initialises the speech decoder
    max_slice_nums: int = 1
    vision: bool = False  # omni session: frames will come
    window: ContextWindow | None = None  # None: the engine's own default


# --- outputs ----------------------------------------------------------------


@dataclass(eq=False)
class TextAudioChunk:
    """One streamed piece of an answer: text delta and/or 24 kHz audio."""

    text: str = ""
    audio: np.ndarray | None = None
    n_tokens: int = 0
    tool_call: ToolCall | None = None  # a whole call, once the model has made it


@dataclass(frozen=True)
class Tools:
    """Functions offered to the model (OpenAI's function-tool JSON: name,
    description, parameters) and how it may use them: ``auto``, ``none``,
    ``required`` or one function's name."""

    functions: tuple[dict, ...] = ()
    choice: str = "auto"

    @property
    def offered(self) -> bool:
        """Whether the model may call any of them."""
        return bool(self.functions) and self.choice != "none"


@dataclass
class PrefillStats:
    """What one duplex prefill added to the model's context, in tokens by
    modality (usage accounting), and what it cost."""

    vision_slices: int = 0
    vision_tokens: int = 0
    audio_tokens: int = 0
    text_tokens: int = 0
    cost_ms: float = 0.0


@dataclass(eq=False)
class DuplexUnit:
    """The model's decision for one 1 s unit."""

    is_listen: bool
    text: str = ""
    audio: np.ndarray | None = None  # 24 kHz
    end_of_turn: bool = False
    kv_cache_length: int = 0
    # The context's room (positions) and the units its window dropped so far.
    context_capacity: int | None = None
    evicted_units: int = 0
    # Input the step added to the context outside prefill (a cascade commits
    # the transcribed user turn when it starts answering).
    input_text_tokens: int = 0
    n_tokens: int = 0
    n_tts_tokens: int = 0
    cost_llm_ms: float = 0.0
    cost_tts_prep_ms: float = 0.0
    cost_tts_ms: float = 0.0
    cost_token2wav_ms: float = 0.0


@dataclass(frozen=True)
class UnitInput:
    """One duplex unit's input: :meth:`DuplexSession.prefill`'s arguments and
    :meth:`DuplexSession.generate`'s, for :meth:`DuplexSession.unit`."""

    audio: np.ndarray
    frames: list[bytes]
    max_slice_nums: int | None = None
    force_listen: bool = False
