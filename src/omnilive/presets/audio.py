"""A preset's audio: its system-prompt audio items and its reference voice, as
16 kHz float32, spoken by espeak-ng (cached) or decoded from files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnilive.config import VoiceSettings
from omnilive.presets.catalog import AudioSource, PresetFile
from omnilive.voices.decode import decode_file
from omnilive.voices.speech import SpeechCache


class PresetAudioError(ValueError):
    """A preset names audio that cannot be produced (a bad file, a path outside its folder)."""


@dataclass(frozen=True)
class PresetAudio:
    system: list[np.ndarray]
    voice: np.ndarray | None


def _file_path(source: PresetFile, relative: str) -> Path:
    """A file named by a preset: relative to its YAML, never outside its folder."""
    if Path(relative).is_absolute():
        raise PresetAudioError(f"{relative!r}: preset files are relative to the preset")
    path = (source.folder / relative).resolve()
    if not path.is_relative_to(source.root.resolve()):
        raise PresetAudioError(f"{relative!r} is outside the preset folder")
    if not path.is_file():
        raise PresetAudioError(f"{relative!r} does not exist")
    return path


def _audio(
    source: PresetFile, item: AudioSource, cache: SpeechCache, limits: VoiceSettings
) -> np.ndarray:
    if item.speak is not None:
        return cache.speech(item.speak, item.voice)
    assert item.file is not None
    path = _file_path(source, item.file)
    return decode_file(path, limits.max_duration_s, limits.decode_timeout_s)


def render(source: PresetFile, cache: SpeechCache, limits: VoiceSettings) -> PresetAudio:
    """All audio of one preset. Blocking (espeak-ng, ffmpeg, files)."""
    preset = source.preset
    system = [_audio(source, item, cache, limits) for item in preset.audio_items]
    voice = None
    if preset.voice is not None and preset.voice.has_audio:
        voice = _audio(source, preset.voice.source(), cache, limits)
    return PresetAudio(system=system, voice=voice)
