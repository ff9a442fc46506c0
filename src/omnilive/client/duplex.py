"""Full duplex, audio and omni (``WS /ws/duplex/{session_id}``): every second
the model hears a unit of audio (and sees frames, in omni) and decides to
listen or speak.

::

    async with Duplex(url, mode="audio") as session:
        await session.send(microphone_piece)  # any size: the client makes 1 s units
        async for event in session:
            if isinstance(event, Result) and not event.is_listen:
                play(event.audio)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Unpack

import numpy as np

from omnilive.client.audio import encode_pcm
from omnilive.client.connection import DEFAULT_URL, ws_url
from omnilive.client.session import (
    ConnectOptions,
    InputHints,
    PreparedSession,
    Voice,
    build,
    frames_b64,
    voice_fields,
)
from omnilive.client.units import MAX_FRAMES, Unit, UnitAssembler
from omnilive.ids import mint
from omnilive.protocol.duplex import AudioChunk, Pause, Prepare, Resume, Stop, Update


class Duplex(PreparedSession):
    """A duplex session. ``mode`` is ``audio`` or ``omni`` (frames: JPEG bytes).
    Events: the queue's, :class:`Prepared`, one :class:`Result` per unit,
    :class:`Paused`, :class:`Resumed`, :class:`Updated`, :class:`ServerError`
    (a failed unit; the session goes on), and at the end :class:`Stopped` or
    :class:`SessionTimeout` (``reason``: ``idle`` or ``pause``).

    ``voice`` (the model's) and ``tts_voice`` (its speech's) are reference
    voices: 16 kHz float32 samples, a WAV file's bytes, or a stored voice's
    id. ``config`` goes to the engine as it is.
    """

    STOP = build(Stop, type="stop")

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        mode: Literal["audio", "omni"] = "audio",
        system_prompt: str | None = None,
        config: Mapping[str, Any] | None = None,
        voice: Voice = None,
        tts_voice: Voice = None,
        max_slice_nums: int | None = None,
        deferred_finalize: bool | None = None,
        recording: bool | None = None,
        session_id: str | None = None,
        max_frames: int = MAX_FRAMES,
        **options: Unpack[ConnectOptions],
    ) -> None:
        if mode not in ("audio", "omni"):
            raise ValueError("mode is audio or omni")
        self.mode = mode
        self.session_id = session_id or mint("adx" if mode == "audio" else "odx")
        prepare = build(
            Prepare,
            type="prepare",
            system_prompt=system_prompt,
            config=dict(config) if config is not None else None,
            max_slice_nums=max_slice_nums,
            deferred_finalize=deferred_finalize,
            recording=recording,
            **_voices(voice, tts_voice),
        )
        self.units = UnitAssembler(max_frames=max_frames)
        self.units_sent = 0
        super().__init__(url, prepare, **options)

    def _socket_url(self) -> str:
        return ws_url(self.url, f"/ws/duplex/{self.session_id}", mode=self.mode)

    async def send(
        self, audio: np.ndarray, frames: Sequence[bytes] = (), **hints: Unpack[InputHints]
    ) -> int:
        """Audio of any size (16 kHz mono float32), with the camera frames seen
        meanwhile; each whole second goes out as one unit. Send in real time
        (the server drops the oldest units when the model falls behind).
        Returns how many units went out."""
        self.machine.check_sendable()
        units = self.units.add(audio, frames, hints.get("force_listen", False))
        for unit in units:
            await self._send_unit(unit, hints.get("max_slice_nums"))
        return len(units)

    async def flush(self) -> bool:
        """Send the unit in progress, padded with silence (e.g. at the end of a file)."""
        unit = self.units.flush()
        if unit is not None:
            await self._send_unit(unit, None)
        return unit is not None

    def force_listen(self) -> None:
        """Interrupt the model: the next unit asks it to listen."""
        self.units.force_listen()

    async def _send_unit(self, unit: Unit, max_slice_nums: int | None) -> None:
        message = build(
            AudioChunk,
            type="audio_chunk",
            audio_base64=encode_pcm(unit.audio),
            frame_base64_list=frames_b64(unit.frames),
            force_listen=unit.force_listen or None,
            max_slice_nums=max_slice_nums,
        )
        await self._send(message)
        self.units_sent += 1

    async def pause(self, timeout: float | None = None) -> None:
        """Hold the session (answered by ``Paused``); it ends if not resumed in time."""
        await self._send(build(Pause, type="pause", timeout=timeout))

    async def resume(self) -> None:
        await self._send(build(Resume, type="resume"))

    async def update(
        self, system_prompt: str | None = None, voice: Voice = None, tts_voice: Voice = None
    ) -> None:
        """New instructions or voice from the next turn on (answered by ``Updated``)."""
        message = build(
            Update, type="update", system_prompt=system_prompt, **_voices(voice, tts_voice)
        )
        await self._send(message)


def _voices(voice: Voice, tts_voice: Voice) -> dict[str, str]:
    return {
        **voice_fields(voice, "ref_audio_base64", "ref_audio_id"),
        **voice_fields(tts_voice, "tts_ref_audio_base64", "tts_ref_audio_id"),
    }
