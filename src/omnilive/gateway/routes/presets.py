"""``GET /api/presets`` and ``GET /api/presets/{mode}/{id}/audio``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnilive.audio import INPUT_RATE, pcm_to_b64
from omnilive.config import VoiceSettings, reference_name
from omnilive.gateway.catalogs import Catalogs, catalogs_of
from omnilive.gateway.http_errors import error_response
from omnilive.gateway.state import gateway_of
from omnilive.presets.audio import PresetAudio, PresetAudioError, render
from omnilive.voices.decode import DecoderUnavailable, UndecodableAudio
from omnilive.voices.speech import SpeechError

router = APIRouter()


def _durations(audio: PresetAudio) -> tuple[list[float], float | None]:
    seconds = [samples.size / INPUT_RATE for samples in audio.system]
    return seconds, (audio.voice.size / INPUT_RATE if audio.voice is not None else None)


def _listing(catalogs: Catalogs, limits: VoiceSettings) -> dict[str, list[dict[str, Any]]]:
    """Every mode's presets, keyed by the reference's mode names (blocking:
    audio durations come from rendering it, which is cached after the first time)."""
    listing: dict[str, list[dict[str, Any]]] = {}
    for mode, files in catalogs.presets.load().items():
        summaries = []
        for found in files:
            try:
                summaries.append(found.summary(*_durations(render(found, catalogs.speech, limits))))
            except (SpeechError, DecoderUnavailable, PresetAudioError, UndecodableAudio):
                summaries.append(found.summary())  # listed all the same; its audio says why
        listing[reference_name(mode)] = summaries
    return listing


@router.get("/api/presets")
async def list_presets(request: Request) -> dict[str, Any]:
    """Every mode's presets, in order, without audio data."""
    limits = gateway_of(request).settings.voices
    return await asyncio.to_thread(_listing, catalogs_of(request), limits)


def _clip(samples: np.ndarray, name: str) -> dict[str, Any]:
    return {
        "data": pcm_to_b64(samples),
        "name": name,
        "duration": round(samples.size / INPUT_RATE, 1),
    }


@router.get("/api/presets/{mode}/{preset_id}/audio", response_model=None)
async def preset_audio(
    mode: str, preset_id: str, request: Request
) -> dict[str, Any] | JSONResponse:
    """The preset's system-prompt audio items (``system_content_audio``) and
    reference voice (``ref_audio``), base64 float32 16 kHz, each key only when
    the preset has such audio (spoken by espeak-ng on first use, then cached)."""
    catalogs = catalogs_of(request)
    found = await asyncio.to_thread(catalogs.presets.find, mode, preset_id)
    if found is None:
        return error_response(404, f"Preset not found: {mode}/{preset_id}", "not_found")
    limits = gateway_of(request).settings.voices
    try:
        audio = await asyncio.to_thread(render, found, catalogs.speech, limits)
    except (SpeechError, DecoderUnavailable) as exc:
        return error_response(503, str(exc), "audio_unavailable")
    except (PresetAudioError, UndecodableAudio) as exc:
        return error_response(500, f"preset {mode}/{preset_id}: {exc}", "invalid_preset")
    answer: dict[str, Any] = {"sample_rate": INPUT_RATE}
    if found.preset.audio_items:
        answer["system_content_audio"] = [
            _clip(samples, f"{preset_id}-{k + 1}.wav") for k, samples in enumerate(audio.system)
        ]
    if audio.voice is not None:
        answer["ref_audio"] = _clip(audio.voice, f"{preset_id}-voice.wav")
    return answer
