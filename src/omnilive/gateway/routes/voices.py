"""Reference voices: the engine's default, and stored uploads.

``GET /api/default_ref_audio``, ``GET|POST /api/assets/ref_audio``,
``GET /api/assets/ref_audio/{id}/audio``; deleting is an admin action
(``admin.py``). Audio goes out as base64 float32 16 kHz, as sessions take it.

An upload is capped before it is parsed (the body is read up to the cap, then
handed to the multipart parser), decoded by ffmpeg off the event loop, and
checked for duration before anything is stored.
"""

from __future__ import annotations

import asyncio
from pathlib import PurePath
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException

from omnilive.audio import INPUT_RATE, AudioDecodeError, decode_b64, pcm_to_b64
from omnilive.gateway.catalogs import catalogs_of
from omnilive.gateway.http_body import is_json_type, read_capped, with_body
from omnilive.gateway.http_errors import HttpRefusal, error_response
from omnilive.gateway.state import gateway_of
from omnilive.protocol.common import (
    Base64Str,
    ProtocolError,
    describe_validation_error,
    load_json,
)
from omnilive.voices.decode import DecoderUnavailable, UndecodableAudio, decode_bytes
from omnilive.voices.default import default_voice
from omnilive.voices.speech import SpeechError
from omnilive.voices.store import StoreFull, UnknownVoice, clean_name

router = APIRouter()
# Room for the multipart boundaries, headers and the ``name`` field.
MULTIPART_MARGIN = 64 * 1024
MB = 1024 * 1024


def _audio_body(samples: Any) -> dict[str, Any]:
    """Audio as the reference's pages read it, plus its exact duration."""
    return {
        "base64": pcm_to_b64(samples),
        "sample_rate": INPUT_RATE,
        "samples": int(samples.size),
        "duration": round(samples.size / INPUT_RATE, 1),
        "duration_s": round(samples.size / INPUT_RATE, 3),
    }


@router.get("/api/default_ref_audio", response_model=None)
async def default_ref_audio(request: Request) -> dict[str, Any] | JSONResponse:
    """The engine's default voice (an espeak-ng sample when it has no reference)."""
    gateway = gateway_of(request)
    engine = gateway.engine_name() or gateway.settings.engine
    speech = catalogs_of(request).speech
    try:
        voice = await asyncio.to_thread(default_voice, gateway.settings, engine, speech)
    except (SpeechError, DecoderUnavailable, UndecodableAudio) as exc:
        message = f"the default voice is not available: {exc}"
        return error_response(503, message, "audio_unavailable")
    return {"name": voice.name, **_audio_body(voice.audio)}


@router.get("/api/assets/ref_audio")
async def list_voices(request: Request) -> dict[str, Any]:
    voices = await asyncio.to_thread(catalogs_of(request).voices.entries)
    return {"total": len(voices), "ref_audios": [voice.listing() for voice in voices]}


@router.get("/api/assets/ref_audio/{voice_id}/audio", response_model=None)
async def voice_audio(voice_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    try:
        samples = await asyncio.to_thread(catalogs_of(request).voices.load, voice_id)
    except UnknownVoice as exc:
        return error_response(404, str(exc), "not_found")
    return _audio_body(samples)


class VoiceUpload(BaseModel):
    """The reference's JSON upload: an audio file of any common format, base64."""

    name: str | None = None
    audio_base64: Base64Str


async def _json_upload(body: bytes) -> tuple[bytes, str | None]:
    try:
        upload = VoiceUpload.model_validate(load_json(body))
        return decode_b64(upload.audio_base64), upload.name
    except ProtocolError as exc:
        raise _BadUpload(f"JSON upload: {exc.message}") from None
    except ValidationError as exc:
        raise _BadUpload(f"JSON upload: {describe_validation_error(exc)}") from None
    except AudioDecodeError as exc:
        raise _BadUpload(f"JSON upload: audio_base64: {exc}") from None


async def _multipart_upload(request: Request, body: bytes, cap: int) -> tuple[bytes, str | None]:
    try:
        async with with_body(request, body).form(max_files=1, max_fields=4) as form:
            upload, name = form.get("file"), form.get("name")
            if not isinstance(upload, UploadFile):
                raise _BadUpload(
                    "send multipart/form-data with a file field 'file', "
                    "or JSON {name, audio_base64}"
                )
            data = await upload.read(cap + 1)
            label = name if isinstance(name, str) else None
            return data, label or clean_name(PurePath(upload.filename or "").stem)
    except MultiPartException as exc:
        raise _BadUpload(f"bad multipart body: {exc.message}") from None


class _BadUpload(Exception):
    pass


@router.post("/api/assets/ref_audio", status_code=201, response_model=None)
async def upload_voice(request: Request) -> JSONResponse:
    """A voice as multipart ``file`` (WAV, MP3, OGG, WebM/Opus, M4A, FLAC) and
    ``name``, or as the reference's JSON ``{name, audio_base64}``: stored as a
    16 kHz mono WAV under a fresh id."""
    limits = gateway_of(request).settings.voices
    cap = int(limits.max_upload_mb * MB)
    too_large = f"uploads are limited to {limits.max_upload_mb:g} MB"
    try:
        body = await read_capped(request, cap * 4 // 3 + MULTIPART_MARGIN)
    except HttpRefusal:
        return error_response(413, too_large, "payload_too_large")
    try:
        if is_json_type(request.headers.get("content-type", "")):
            data, name = await _json_upload(body)
        else:
            data, name = await _multipart_upload(request, body, cap)
    except _BadUpload as exc:
        return error_response(422, str(exc), "invalid_request")
    if len(data) > cap:
        return error_response(413, too_large, "payload_too_large")
    try:
        samples = await asyncio.to_thread(
            decode_bytes, data, limits.max_duration_s + 1.0, limits.decode_timeout_s
        )
    except UndecodableAudio as exc:
        return error_response(422, str(exc), "undecodable_audio")
    except DecoderUnavailable as exc:
        return error_response(503, str(exc), "audio_unavailable")
    seconds = samples.size / INPUT_RATE
    if seconds > limits.max_duration_s:
        message = f"the audio is longer than {limits.max_duration_s:g} s"
        return error_response(422, message, "audio_too_long")
    if seconds < limits.min_duration_s:
        message = f"the audio is {seconds:.2f} s; a voice needs {limits.min_duration_s:g} s"
        return error_response(422, message, "audio_too_short")
    try:
        voice = await asyncio.to_thread(
            catalogs_of(request).voices.add, samples, clean_name(name), limits.max_count
        )
    except StoreFull as exc:
        return error_response(507, str(exc), "storage_full")
    answer = {
        **voice.listing(),
        "success": True,
        "message": f"Uploaded successfully, duration={round(seconds * 1000)}ms",
    }
    return JSONResponse(answer, status_code=201)
