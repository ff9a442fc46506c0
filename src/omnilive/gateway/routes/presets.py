"""``GET /api/presets`` and ``GET /api/presets/{mode}/{id}/audio``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnilive.audio import INPUT_RATE, pcm_to_b64
from omnilive.gateway.catalogs import catalogs_of
from omnilive.gateway.state import gateway_of
from omnilive.presets.audio import PresetAudioError, render
from omnilive.voices.decode import DecoderUnavailable, UndecodableAudio
from omnilive.voices.speech import SpeechError

router = APIRouter()


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status)


@router.get("/api/presets")
async def list_presets(request: Request) -> dict[str, Any]:
    """Every mode's presets, in order, without audio data."""
    catalog = await asyncio.to_thread(catalogs_of(request).presets.load)
    return {"presets": {mode: [f.summary() for f in files] for mode, files in catalog.items()}}


@router.get("/api/presets/{mode}/{preset_id}/audio", response_model=None)
async def preset_audio(
    mode: str, preset_id: str, request: Request
) -> dict[str, Any] | JSONResponse:
    """The preset's system-prompt audio items and reference voice, as base64
    float32 16 kHz (spoken by espeak-ng on first use, then cached)."""
    catalogs = catalogs_of(request)
    found = await asyncio.to_thread(catalogs.presets.find, mode, preset_id)
    if found is None:
        return _error(404, f"no preset {preset_id!r} for mode {mode!r}", "not_found")
    limits = gateway_of(request).settings.voices
    try:
        audio = await asyncio.to_thread(render, found, catalogs.speech, limits)
    except (SpeechError, DecoderUnavailable) as exc:
        return _error(503, str(exc), "audio_unavailable")
    except (PresetAudioError, UndecodableAudio) as exc:
        return _error(500, f"preset {mode}/{preset_id}: {exc}", "invalid_preset")
    return {
        "system_audio": [pcm_to_b64(samples) for samples in audio.system],
        "voice_audio": pcm_to_b64(audio.voice) if audio.voice is not None else None,
        "sample_rate": INPUT_RATE,
    }
