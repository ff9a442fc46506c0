"""Half-duplex voice (``WS /ws/half_duplex/{session_id}``): send audio as it
comes; the server's VAD hears when you stop, and the model answers.

::

    async with HalfDuplex(url, system_prompt="Answer briefly.") as session:
        await session.send(question)  # 16 kHz float32, any length
        async for event in session:
            if isinstance(event, Chunk):
                print(event.text, end="")
            elif isinstance(event, TurnDone):
                break
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from omnilive.client.audio import INPUT_RATE, chunks, encode_pcm
from omnilive.client.connection import DEFAULT_URL, ws_url
from omnilive.client.events import Event, Generating, Interrupted, TurnDone
from omnilive.client.session import ConnectOptions, PreparedSession, Voice, build, voice_fields
from omnilive.ids import mint
from omnilive.protocol.half_duplex import (
    AudioChunk,
    HalfDuplexConfig,
    HalfDuplexGeneration,
    Playback,
    Prepare,
    SessionSettings,
    Stop,
    VadSettings,
)

# The server takes at most a few seconds per chunk; a microphone sends ~0.5 s.
MAX_CHUNK_S = 1.0


class HalfDuplex(PreparedSession):
    """A half-duplex session. Events: the queue's, :class:`Prepared`,
    :class:`VadState`, :class:`Generating`, :class:`Chunk`, :class:`TurnDone`,
    :class:`Interrupted` (barge-in), :class:`ServerError` (a failed turn; the
    session goes on), and at the end
    :class:`Stopped` or :class:`SessionTimeout`.

    ``voice`` is a reference voice (16 kHz float32 samples, a WAV file's
    bytes, or a stored voice's id). ``system_content`` mixes text and audio
    (strings and 16 kHz arrays). ``vad`` and ``generation`` take the
    protocol's fields (e.g. ``{"min_silence_duration_ms": 500}``).
    """

    STOP = build(Stop, type="stop")

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        system_prompt: str | None = None,
        system_content: Sequence[str | np.ndarray] | None = None,
        voice: Voice = None,
        vad: Mapping[str, Any] | VadSettings | None = None,
        generation: Mapping[str, Any] | HalfDuplexGeneration | None = None,
        tts: bool | None = None,
        timeout_s: float | None = None,
        recording: bool | None = None,
        session_id: str | None = None,
        **options: Unpack[ConnectOptions],
    ) -> None:
        self.session_id = session_id or mint("hd")
        config = build(
            HalfDuplexConfig,
            vad=vad,
            generation=generation,
            tts={"enabled": tts} if tts is not None else None,
            session=build(SessionSettings, timeout_s=timeout_s) if timeout_s else None,
        )
        content = None
        if system_content is not None:
            content = [
                {"type": "text", "text": item}
                if isinstance(item, str)
                else {"type": "audio", "data": encode_pcm(item)}
                for item in system_content
            ]
        # Checked now, by the server's own model: a bad field fails here, not later.
        prepare = build(
            Prepare,
            type="prepare",
            system_prompt=system_prompt,
            system_content=content,
            config=config or None,
            recording=recording,
            **voice_fields(voice, "ref_audio_base64", "ref_audio_id"),
        )
        self.answering = False  # between ``generating`` and ``turn_done``
        super().__init__(url, prepare, **options)

    def _socket_url(self) -> str:
        return ws_url(self.url, f"/ws/half_duplex/{self.session_id}")

    def _observe(self, event: Event) -> None:
        if isinstance(event, Generating):
            self.answering = True
        elif isinstance(event, TurnDone | Interrupted):
            self.answering = False

    async def report_playback(self, turn_index: int, played_ms: float) -> None:
        """Say how much of answer ``turn_index`` the user heard (e.g. playback
        was stopped when they interrupted): the model's context keeps only
        that part. Answered by a :class:`PlaybackApplied` event."""
        message = {"type": "playback", "turn_index": turn_index, "played_ms": played_ms}
        await self._send(build(Playback, **message))

    async def send(self, audio: np.ndarray) -> None:
        """Audio as it comes (16 kHz mono float32, any length). What is sent while
        the model answers is not heard (unless the session was prepared with
        ``config={"barge_in": True}``: then speech interrupts the answer): a
        client with a speaker should hold its microphone then (``answering``),
        or the model hears itself."""
        for piece in chunks(np.asarray(audio, dtype=np.float32), MAX_CHUNK_S, INPUT_RATE):
            await self._send(build(AudioChunk, type="audio_chunk", audio_base64=encode_pcm(piece)))
