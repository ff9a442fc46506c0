"""Presets: who the assistant is and how it sounds, per mode, one YAML file each.

A preset folder holds ``<mode>/<id>.yaml`` for the modes ``turnbased``,
``half_duplex``, ``audio_duplex`` and ``omni``. The built-in folder ships with
the package; operators add folders (``presets.dirs``), read in order after it,
so a later preset with the same mode and id replaces an earlier one.

A file::

    id: assistant_en
    name: English assistant
    name_zh: 英文助手          # optional
    order: 10                 # listing order within the mode
    system_prompt:            # or a plain string
      - {type: text, text: "You are ..."}
      - {type: audio, speak: "A sentence.", voice: en-us}   # made with espeak-ng
      - {type: audio, file: voices/me.wav}                  # relative to this file
    voice: {name: en-us}      # or {speak: ..., voice: ...} or {file: ...}

A file that does not parse is skipped with a warning: one broken preset must
not take the others down.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from omnilive.config import our_name
from omnilive.ids import is_safe_id

log = logging.getLogger(__name__)

Mode = Literal["turnbased", "half_duplex", "audio_duplex", "omni"]
MODES: tuple[Mode, ...] = ("turnbased", "half_duplex", "audio_duplex", "omni")
MAX_FILE_BYTES = 256 * 1024


_ESPEAK_VOICE = re.compile(r"^[A-Za-z0-9_+-]{1,40}$")
_STRICT = ConfigDict(extra="forbid", frozen=True)


def _espeak_voice(value: str) -> str:
    if not _ESPEAK_VOICE.match(value):
        raise ValueError(f"{value!r} is not an espeak-ng voice name")
    return value


EspeakVoice = Annotated[str, AfterValidator(_espeak_voice)]


class TextItem(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class AudioSource(BaseModel):
    """Audio either spoken by espeak-ng (``speak`` + ``voice``) or read from ``file``."""

    model_config = _STRICT
    speak: str | None = None
    voice: EspeakVoice = "en-us"
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> AudioSource:
        if (self.speak is None) == (self.file is None):
            raise ValueError("give exactly one of speak or file")
        return self


class AudioItem(AudioSource):
    type: Literal["audio"]


class VoiceSpec(BaseModel):
    """A named voice of the engine, or a reference recording (spoken or a file)."""

    model_config = _STRICT
    name: str | None = None
    speak: str | None = None
    voice: EspeakVoice = "en-us"
    file: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> VoiceSpec:
        if sum(value is not None for value in (self.name, self.speak, self.file)) != 1:
            raise ValueError("give exactly one of name, speak or file")
        return self

    @property
    def has_audio(self) -> bool:
        return self.name is None

    def source(self) -> AudioSource:
        return AudioSource(speak=self.speak, voice=self.voice, file=self.file)


SystemItem = Annotated[TextItem | AudioItem, Field(discriminator="type")]


class Preset(BaseModel):
    """One preset file's content."""

    model_config = _STRICT
    id: str
    name: str = Field(min_length=1, max_length=120)
    name_zh: str | None = Field(None, max_length=120)
    description: str = Field("", max_length=500)
    order: int = 100
    system_prompt: list[SystemItem] = Field(default_factory=list)
    voice: VoiceSpec | None = None

    @field_validator("id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        if not is_safe_id(value):
            raise ValueError("id must be 1-128 of A-Z a-z 0-9 _ -")
        return value

    @field_validator("system_prompt", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return [{"type": "text", "text": value}] if isinstance(value, str) else value

    @property
    def text(self) -> str:
        return "\n".join(item.text for item in self.system_prompt if isinstance(item, TextItem))

    @property
    def audio_items(self) -> list[AudioItem]:
        return [item for item in self.system_prompt if isinstance(item, AudioItem)]


@dataclass(frozen=True)
class PresetFile:
    """A preset and where it came from: files it names are relative to ``folder``
    and must stay inside ``root`` (the configured preset folder)."""

    mode: Mode
    preset: Preset
    folder: Path
    root: Path

    def audio_path(self, part: str) -> str:
        """How the listing names one of the preset's audio parts (``system/0``, ``voice``)."""
        return f"{self.mode}/{self.preset.id}/{part}"

    def summary(
        self, system_durations: list[float] | None = None, voice_duration: float | None = None
    ) -> dict[str, Any]:
        """The preset as ``GET /api/presets`` lists it, without audio data: the
        reference's ``system_prompt`` (text), ``system_content`` (text and audio
        items) and ``ref_audio``, whose audio comes from the ``/audio`` route,
        and our ``name_zh``, ``has_audio`` and ``voice``. Durations are in
        seconds, when known."""
        p = self.preset
        durations = iter(system_durations or [])
        content: list[dict[str, Any]] = []
        for item in p.system_prompt:
            if isinstance(item, TextItem):
                content.append({"type": "text", "text": item.text})
                continue
            index = sum(1 for c in content if c["type"] == "audio")
            content.append(
                {
                    "type": "audio",
                    "data": None,
                    "path": self.audio_path(f"system/{index}"),
                    "name": f"{p.id}-{index + 1}.wav",
                    "duration": round(next(durations, 0.0), 1),
                }
            )
        summary: dict[str, Any] = {
            "id": p.id,
            "order": p.order,
            "name": p.name,
            "name_zh": p.name_zh,
            "description": p.description,
            "system_prompt": p.text,
            "system_content": content,
            "has_audio": bool(p.audio_items),
            "voice": None,
        }
        if p.voice is not None:
            summary["voice"] = {"has_audio": True} if p.voice.has_audio else {"name": p.voice.name}
            if p.voice.has_audio:
                summary["ref_audio"] = {
                    "data": None,
                    "path": self.audio_path("voice"),
                    "name": f"{p.id}-voice.wav",
                    "duration": round(voice_duration or 0.0, 1),
                }
        return summary


def builtin_dir() -> Path:
    """The presets shipped in the package."""
    return Path(str(resources.files("omnilive.presets") / "builtin"))


def read_preset(path: Path) -> Preset:
    """Parse one YAML file (blocking); ``ValueError`` says what is wrong."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"not YAML: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("a preset is a YAML mapping")
    document.setdefault("id", path.stem)
    try:
        return Preset.model_validate(document)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{where or 'preset'}: {first['msg']}") from None


class PresetCatalog:
    """The built-in presets merged with the configured folders. Reads the files
    on every :meth:`load` (they are few and small), so edits show without a
    restart; blocking, so call it off the event loop."""

    def __init__(self, dirs: list[Path] | None = None, include_builtin: bool = True) -> None:
        self.dirs = [builtin_dir()] if include_builtin else []
        self.dirs.extend(Path(d) for d in dirs or [])

    def load(self) -> dict[Mode, list[PresetFile]]:
        found: dict[Mode, dict[str, PresetFile]] = {mode: {} for mode in MODES}
        for root in self.dirs:
            for mode in MODES:
                folder = root / mode
                if not folder.is_dir():
                    continue
                for path in sorted(folder.glob("*.y*ml")):
                    try:
                        preset = read_preset(path)
                    except (OSError, ValueError) as exc:
                        log.warning("skipping preset %s: %s", path, exc)
                        continue
                    found[mode][preset.id] = PresetFile(mode, preset, folder, root)
        return {
            mode: sorted(by_id.values(), key=lambda f: (f.preset.order, f.preset.id))
            for mode, by_id in found.items()
        }

    def find(self, mode: str, preset_id: str) -> PresetFile | None:
        """A preset by mode (ours or the reference's name for it) and id."""
        mode = our_name(mode)
        if mode not in MODES:
            return None
        return next((f for f in self.load()[mode] if f.preset.id == preset_id), None)
