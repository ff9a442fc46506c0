"""A deterministic engine with no model, for tests and for trying the server.

Answers are derived from the input so a test can tell the input arrived; every
text chunk carries real 24 kHz audio (a tone whose length follows the text).
Directives in the system prompt or a user message change behaviour per
session, so tests that run real processes need no restart:

``#latency:0.3``      sleep this long in every model step
``#fail:prefill``     the chat prefill raises
``#fail:generate``    chat generation raises after its first chunk
``#fail-turn:N``      half-duplex turn N (0-based) raises during generation
``#fail-unit:N``      duplex unit N (0-based) raises in generate
``#schedule:LLSSE``   duplex plan per unit, repeated: L listen, S speak, E speak + end turn
``#kv-per-unit:N``    duplex KV-cache growth per unit (to reach context limits quickly)
``#fail-from:N``     every duplex unit from the N-th on fails
``#finalize-latency:0.3``  sleep this long in every duplex finalize
``#speak-seconds:0.7``  audio per duplex speak unit (S; E units get half), default 1.0

Text appended to a duplex context (the Live API's appends): commentary is
said verbatim at the next unit, whatever the schedule (one unit that ends
the turn); instructions with directives change them, as an update does.

Half-duplex conversations a client edits (the OpenAI Realtime dialect): the
transcript of speech is ``"<seconds> s of speech"``; an answer without
speech repeats the last user text or tool output (``Answered: ...``); with
tools offered, a user text that names a tool (or a forced choice) gets a
call to it whose arguments echo that text (``{"text": ...}``).

The duplex view also enforces the model's ordering rule: a prefill before the
previous unit's finalize raises, so a runner that breaks it fails loudly.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from omnilive.audio import INPUT_RATE, OUTPUT_RATE, rms, tone
from omnilive.config import Settings
from omnilive.engine_settings import ScriptedSettings
from omnilive.engines.appends import ContextNote, NoteKind
from omnilive.engines.base import (
    Capabilities,
    Engine,
    EngineError,
    ProgressCallback,
)
from omnilive.engines.context_window import ContextLedger
from omnilive.engines.load_faults import fail_load
from omnilive.engines.messages import (
    AudioPart,
    ChatMessage,
    ChatOptions,
    ContextWindow,
    DuplexOptions,
    DuplexUnit,
    HalfDuplexOptions,
    ImagePart,
    Modality,
    Part,
    PrefillStats,
    TextAudioChunk,
    TextPart,
    ToolCall,
    Tools,
    VideoPart,
    Voice,
)
from omnilive.engines.sync_views import SyncChatSession, SyncDuplexSession, SyncHalfDuplexSession

_DIRECTIVE = re.compile(r"#([a-z-]+):([A-Za-z0-9_.]+)")
AUDIO_SECONDS_PER_CHAR = 0.05
CONTEXT_LENGTH = 8192


def directives(text: str) -> dict[str, str]:
    return dict(_DIRECTIVE.findall(text))


def speech_for(text: str) -> np.ndarray:
    """Audio for a text chunk: a tone whose pitch and length follow the text."""
    freq = 220.0 + (sum(map(ord, text)) % 32) * 20.0
    return tone(max(0.05, len(text) * AUDIO_SECONDS_PER_CHAR), OUTPUT_RATE, freq)


def chunk_text(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _size_of(image: bytes) -> str:
    """`` WxH`` of an encoded image, read from its header."""
    with Image.open(io.BytesIO(image)) as opened:
        return " {}x{}".format(*opened.size)


def describe_voice(voice: Voice | None) -> str:
    if voice is None:
        return ""
    if voice.reference is not None:
        return f" (voice: {voice.reference.size / INPUT_RATE:.2f} s reference)"
    return f" (voice: {voice.name})" if voice.name else ""


@dataclass
class _Knobs:
    latency_s: float
    schedule: str
    fail: str | None = None
    fail_turn: int | None = None
    fail_unit: int | None = None
    fail_from: int | None = None
    kv_per_unit: int = 10
    finalize_latency_s: float = 0.0
    speak_seconds: float = 1.0

    @classmethod
    def parse(cls, text: str, settings: ScriptedSettings) -> _Knobs:
        found = directives(text)
        return cls(
            latency_s=float(found.get("latency", settings.step_latency_s)),
            schedule=found.get("schedule", settings.duplex_schedule).upper() or "L",
            fail=found.get("fail"),
            fail_turn=int(found["fail-turn"]) if "fail-turn" in found else None,
            fail_unit=int(found["fail-unit"]) if "fail-unit" in found else None,
            fail_from=int(found["fail-from"]) if "fail-from" in found else None,
            kv_per_unit=int(found.get("kv-per-unit", 10)),
            finalize_latency_s=float(found.get("finalize-latency", 0.0)),
            speak_seconds=float(found.get("speak-seconds", 1.0)),
        )

    def pause(self) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)


def _describe_part(part: Part) -> str:
    if isinstance(part, TextPart):
        return part.text
    if isinstance(part, AudioPart):
        return f"[audio {part.samples.size / INPUT_RATE:.2f} s]"
    if isinstance(part, ImagePart):
        return f"[image {len(part.data)} bytes]"
    if isinstance(part, VideoPart):
        return f"[video {len(part.data)} bytes]"
    raise TypeError(part)


def _count_tokens(parts: list[Part] | tuple[Part, ...]) -> int:
    total = 0
    for part in parts:
        if isinstance(part, TextPart):
            total += len(part.text.split()) + 1
        elif isinstance(part, AudioPart):
            total += max(1, part.samples.size // 1600)
        else:
            total += 64
    return total


class ScriptedChat(SyncChatSession):
    def __init__(self, settings: ScriptedSettings) -> None:
        self._settings = settings
        self._answer = ""
        self._knobs = _Knobs.parse("", settings)
        self._tts = True

    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        all_text = " ".join(m.text for m in messages)
        self._knobs = _Knobs.parse(all_text, self._settings)
        self._knobs.pause()
        if self._knobs.fail == "prefill":
            raise EngineError("scripted failure in prefill")
        last_user = next((m for m in reversed(messages) if m.role == "user"), None)
        heard = " ".join(_describe_part(p) for p in last_user.parts) if last_user else ""
        self._answer = f"You said: {heard}{describe_voice(options.voice)}"
        self._tts = options.tts_enabled
        return sum(_count_tokens(m.parts) for m in messages)

    def generate(self) -> Iterator[TextAudioChunk]:
        for index, piece in enumerate(chunk_text(self._answer, self._settings.chars_per_chunk)):
            self._knobs.pause()
            if index == 1 and self._knobs.fail == "generate":
                raise EngineError("scripted failure in generate")
            audio = speech_for(piece) if self._tts else None
            yield TextAudioChunk(text=piece, audio=audio, n_tokens=len(piece.split()) or 1)


class ScriptedHalfDuplex(SyncHalfDuplexSession):
    def __init__(self, settings: ScriptedSettings) -> None:
        self._settings = settings
        self._knobs = _Knobs.parse("", settings)
        self._turns: list[float] = []  # speech seconds of each turn in context
        self._saved: list[float] = []
        self._pending: float | None = None
        self._options = HalfDuplexOptions()
        self._turn_index = 0
        self._transcript: str | None = None
        self._history: list[ChatMessage] = []
        self._answer_text: str | None = None  # respond(): answer the history
        self._tools = Tools()
        self._heard: str | None = None  # keep_heard(): what was heard of the last answer

    def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        text = " ".join(p.text for p in system if isinstance(p, TextPart))
        self._knobs = _Knobs.parse(text, self._settings)
        self._options = options
        self._knobs.pause()
        return _count_tokens(system)

    def prefill(self, speech: np.ndarray) -> int:
        self._knobs.pause()
        self._pending = speech.size / INPUT_RATE
        heard = f"{self._pending:.2f} s of speech"
        self._transcript = heard if self._settings.transcribes else None
        self._history.append(ChatMessage("user", (TextPart(heard),)))
        return max(1, speech.size // 1600)

    @property
    def transcript(self) -> str | None:
        return self._transcript

    def set_history(self, messages: list[ChatMessage]) -> None:
        self._history = [m for m in messages if m.parts or m.tool_calls]
        system = " ".join(m.text for m in messages if m.role == "system")
        self._knobs = _Knobs.parse(system, self._settings)

    def set_tools(self, tools: Tools) -> None:
        self._tools = tools

    def set_options(self, options: HalfDuplexOptions) -> None:
        self._options = options

    def keep_heard(self, text: str) -> bool:
        self._heard = text
        return True

    def respond(self, instructions: str | None = None) -> None:
        last = next((m for m in reversed(self._history) if m.role in ("user", "tool")), None)
        self._answer_text = last.text if last is not None else ""
        self._pending = None

    def _tool_call(self) -> ToolCall | None:
        last = self._history[-1] if self._history else None
        functions = self._tools.functions
        if not self._tools.offered or last is None or last.role != "user":
            return None
        forced = self._tools.choice.removeprefix("function:")
        named = [f["name"] for f in functions if f["name"] in last.text or f["name"] == forced]
        if not named and self._tools.choice == "required":
            named = [functions[0]["name"]]
        if not named:
            return None
        arguments = json.dumps({"text": last.text})
        return ToolCall(f"call_{self._turn_index}_{len(self._history)}", named[0], arguments)

    def _respond_chunks(self) -> Iterator[TextAudioChunk]:
        text, self._answer_text = self._answer_text or "", None
        call = self._tool_call()
        if call is not None:
            self._history.append(ChatMessage("assistant", (), tool_calls=(call,)))
            yield TextAudioChunk(tool_call=call, n_tokens=1)
            return
        answer = f"Answered: {text}"
        self._history.append(ChatMessage("assistant", (TextPart(answer),)))
        for piece in chunk_text(answer, self._settings.chars_per_chunk):
            self._knobs.pause()
            audio = speech_for(piece) if self._options.tts_enabled else None
            yield TextAudioChunk(text=piece, audio=audio, n_tokens=1)

    def generate(self) -> Iterator[TextAudioChunk]:
        if self._answer_text is not None:
            yield from self._respond_chunks()
            return
        if self._pending is None:
            raise EngineError("generate before prefill")
        heard, self._pending = self._pending, None
        turn, self._turn_index = self._turn_index, self._turn_index + 1
        earlier = ", ".join(f"{d:.2f}" for d in self._turns) or "none"
        # What the user heard of the last answer, where a playback report cut it.
        cut = f"; last answer heard: {self._heard!r}" if self._heard is not None else ""
        self._heard = None
        answer = (
            f"Turn {len(self._turns)}: heard {heard:.2f} s; earlier turns: {earlier}{cut}"
            f"{describe_voice(self._options.voice)}."
        )
        self._turns.append(heard)
        for index, piece in enumerate(chunk_text(answer, self._settings.chars_per_chunk)):
            self._knobs.pause()
            if index == 1 and self._knobs.fail_turn == turn:
                raise EngineError(f"scripted failure in turn {turn}")
            audio = speech_for(piece) if self._options.tts_enabled else None
            yield TextAudioChunk(text=piece, audio=audio, n_tokens=1)

    def snapshot(self) -> None:
        self._saved = list(self._turns)

    def rollback(self) -> None:
        self._turns = list(self._saved)


class ScriptedDuplex(SyncDuplexSession):
    def __init__(self, settings: ScriptedSettings) -> None:
        self._settings = settings
        self._knobs = _Knobs.parse("", settings)
        self._unit = 0
        self._cursor = 0
        self._kv = 0
        self._last_rms = 0.0
        self._frames = 0
        self._frame_size = ""  # " WxH" of the unit's last frame: what the client sent
        self._voice = ""
        self._speaking = False
        self._unfinalized = False  # generate() ran, finalize() not yet
        self._to_say: list[str] = []  # commentary appended, said at the next unit
        self.notes: list[ContextNote] = []  # everything appended, in order

    def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        self._knobs = _Knobs.parse(system_prompt, self._settings)
        self._knobs.pause()
        self._voice = describe_voice(options.tts_voice or options.llm_voice)
        prompt_length = len(system_prompt.split()) + 16
        self._kv = prompt_length
        # The context slides as MiniCPM-o's (no note of what was said is kept here).
        window = options.window or ContextWindow.of(self._settings.duplex_window)
        self._ledger = ContextLedger(window, frozenset(), ())
        self._ledger.system(prompt_length)
        return prompt_length

    def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        if self._unfinalized:
            raise EngineError(
                f"prefill of unit {self._unit} before finalize of unit {self._unit - 1}"
            )
        self._knobs.pause()
        self._last_rms = rms(audio)
        self._frames = len(frames)
        self._frame_size = _size_of(frames[-1]) if frames else ""
        slices = len(frames) * (max_slice_nums or 1)
        self._kv += self._knobs.kv_per_unit + 64 * slices
        return PrefillStats(
            vision_slices=slices, vision_tokens=64 * slices, audio_tokens=self._knobs.kv_per_unit
        )

    def generate(self, force_listen: bool = False) -> DuplexUnit:
        evicted, decided = self._ledger.evicted_units, self._decide(force_listen)
        return dataclasses.replace(decided, context_capacity=CONTEXT_LENGTH, evicted_units=evicted)

    def _decide(self, force_listen: bool) -> DuplexUnit:
        unit, self._unit = self._unit, self._unit + 1
        failing_from = self._knobs.fail_from is not None and unit >= self._knobs.fail_from
        if self._knobs.fail_unit == unit or failing_from:
            raise EngineError(f"scripted failure in unit {unit}")
        self._unfinalized = True
        plan = self._knobs.schedule[self._cursor % len(self._knobs.schedule)]
        self._cursor += 1
        if force_listen:
            if self._speaking:
                self._skip_to_listen()
            self._speaking = False
            return DuplexUnit(is_listen=True, kv_cache_length=self._kv)
        if self._to_say:  # commentary is said at once, whatever the schedule
            return self._say(self._to_say.pop(0), unit)
        if plan == "L":
            self._speaking = False
            return DuplexUnit(is_listen=True, kv_cache_length=self._kv)
        end = plan == "E"
        frames = f"frames {self._frames}{self._frame_size}"
        text = f"unit {unit} rms {self._last_rms:.3f} {frames}{self._voice} "
        seconds = self._knobs.speak_seconds / 2 if end else self._knobs.speak_seconds
        audio = tone(seconds, OUTPUT_RATE, 300.0 + 10 * (unit % 20))
        self._speaking = not end
        self._kv += 8
        return DuplexUnit(
            is_listen=False,
            text=text,
            audio=audio,
            end_of_turn=end,
            kv_cache_length=self._kv,
            n_tokens=8,
            n_tts_tokens=25,
        )

    def finalize(self) -> None:
        if self._knobs.finalize_latency_s:
            time.sleep(self._knobs.finalize_latency_s)
        self._unfinalized = False
        self._ledger.unit_closed(self._kv, [], True)
        self._kv = self._ledger.length

    def update(self, system_prompt: str | None, tts_voice: Voice | None) -> list[str]:
        """New directives and voice apply from the next unit on."""
        if system_prompt is not None:
            self._knobs = _Knobs.parse(system_prompt, self._settings)
        if tts_voice is not None:
            self._voice = describe_voice(tts_voice)
        return []

    def append(self, note: ContextNote) -> int:
        """Commentary is said verbatim at the next unit (one unit, ending the
        turn); instructions may carry directives, as an update's prompt."""
        self.notes.append(note)
        if note.speakable:
            self._to_say.append(note.text)
        elif note.kind is NoteKind.INSTRUCTIONS and directives(note.text):
            self._knobs = _Knobs.parse(note.text, self._settings)
        added = len(note.text.split()) + 4
        self._kv += added
        return added

    def _say(self, text: str, unit: int) -> DuplexUnit:
        self._speaking = False
        self._kv += 8
        audio = tone(self._knobs.speak_seconds / 2, OUTPUT_RATE, 300.0 + 10 * (unit % 20))
        return DuplexUnit(
            is_listen=False,
            text=text,
            audio=audio,
            end_of_turn=True,
            kv_cache_length=self._kv,
            n_tokens=8,
        )

    def _skip_to_listen(self) -> None:
        """A forced listen ends the turn: move the plan to its next listen."""
        schedule = self._knobs.schedule
        for _ in range(len(schedule)):
            if schedule[self._cursor % len(schedule)] == "L":
                return
            self._cursor += 1


class ScriptedEngine(Engine):
    """Deterministic stand-in for a model; see the module docstring."""

    name = "scripted"

    def __init__(self, settings: ScriptedSettings, data_dir: Path | None = None) -> None:
        self._settings = settings
        self._data_dir = data_dir
        self.capabilities = Capabilities(
            input_modalities=frozenset(Modality),
            audio_output=True,
            voice_cloning=True,
            context_length=CONTEXT_LENGTH,
            slots=settings.slots,
            context_window=ContextWindow.of(settings.duplex_window),
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> ScriptedEngine:
        """The engine of ``settings.scripted`` (the registry's factory)."""
        return cls(settings.scripted, settings.data_dir)

    def load(self, progress: ProgressCallback) -> None:
        if self._settings.load_latency_s:
            time.sleep(self._settings.load_latency_s)
        if self._settings.load_fault != "none" and self._fault_this_load():
            fail_load(self._settings.load_fault)
        progress("scripted", 1.0)

    def _fault_this_load(self) -> bool:
        """Whether this load fails: every one, or the first ``load_faults``
        (counted in a file of the data dir, across worker restarts)."""
        limit = self._settings.load_faults
        if not limit or self._data_dir is None:
            return True
        counter = self._data_dir / "state" / "scripted-load-faults"
        counter.parent.mkdir(parents=True, exist_ok=True)
        done = int(counter.read_text() or 0) if counter.exists() else 0
        counter.write_text(str(done + 1))
        return done < limit

    def open_chat(self) -> SyncChatSession:
        return ScriptedChat(self._settings)

    def open_half_duplex(self) -> SyncHalfDuplexSession:
        return ScriptedHalfDuplex(self._settings)

    def open_duplex(self) -> SyncDuplexSession:
        return ScriptedDuplex(self._settings)
