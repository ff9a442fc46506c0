"""The Realtime API (``WS /v1/realtime?mode=video|audio|chat``), in both dialects.

``dialect="v1"`` speaks the older one (spec/realtime-api.md: ``session.update``,
``input_audio_buffer.append``, ``response.listen`` / ``response.output_audio.delta``);
``"v2"`` the newer one (spec/realtime-v2.md: ``session.init``, ``input.append``,
``response.output.delta{kind}``, ``response.done``), which ``mode="chat"`` needs.

::

    async with Realtime(url, mode="audio", instructions="Answer briefly.") as session:
        await session.send(microphone_piece)  # any length: the server makes 1 s units
        async for event in session:
            if isinstance(event, Speech):
                play(event.audio)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Unpack

import numpy as np

from omnilive.client.audio import encode_pcm
from omnilive.client.chat import Messages, chat_request, joined_audio
from omnilive.client.connection import DEFAULT_URL, ws_url
from omnilive.client.errors import (
    BackendError,
    OmniliveError,
    ServerShutdownError,
    SessionFailedError,
)
from omnilive.client.events import AudioDelta, Event, ResponseDone, SessionClosed, SessionCreated
from omnilive.client.machine import ModeRules
from omnilive.client.session import (
    ConnectOptions,
    InputHints,
    Session,
    Voice,
    build,
    frames_b64,
    voice_fields,
)
from omnilive.ids import mint
from omnilive.protocol.realtime import Append, ResponseCancel, SessionClose, SessionUpdate
from omnilive.protocol.realtime_v2 import DuplexInput, InputAppend, SessionInit

Dialect = Literal["v1", "v2"]
_FAILURES: dict[str, type[OmniliveError]] = {
    "error": SessionFailedError,
    "backend_error": BackendError,
    "server_shutdown": ServerShutdownError,
}


class RealtimeHints(InputHints, total=False):
    input_id: str | None  # v2: echoed on the output this input produced


STOP = build(SessionClose, type="session.close", reason="user_stop")


def closed_as_failure(event: Event) -> OmniliveError | None:
    """A ``session.closed`` that ends the session as failed, as its exception."""
    if isinstance(event, SessionClosed) and event.reason in _FAILURES:
        return _FAILURES[event.reason](event.message or str(event.reason))
    return None


def _session_update(
    instructions: str | None, voice: Voice, tts_voice: Voice, **fields: Any
) -> dict[str, Any]:
    """The older dialect's ``session.update``: configuring, and changing a session."""
    session = {
        "instructions": instructions,
        **voice_fields(voice, "ref_audio", "ref_audio_id"),
        **voice_fields(tts_voice, "tts_ref_audio", "tts_ref_audio_id"),
        **fields,
    }
    session = {k: v for k, v in session.items() if v is not None}
    return build(SessionUpdate, type="session.update", session=session)


class Realtime(Session):
    """A Realtime API session. Events: the queue's (``session.queued`` is a
    :class:`Queued`, ...), :class:`SessionCreated`, then in ``v1``
    :class:`Listen` / :class:`Speech` per unit, :class:`SessionUpdated`,
    :class:`ResponseCancelled`, :class:`ServerError` (client errors; the
    session goes on); in ``v2`` :class:`Listen`, :class:`TextDelta`,
    :class:`AudioDelta` and, in chat mode, :class:`ResponseDone`; at the end
    :class:`SessionClosed` (an ``error`` / ``backend_error`` close raises).

    ``voice`` (the model's) and ``tts_voice`` (its speech's) are reference
    voices: 16 kHz float32 samples, a WAV file's bytes, or (``v1`` only) a
    stored voice's id. ``config`` goes to the engine as it is (``v2``).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        mode: Literal["audio", "video", "chat"] = "audio",
        dialect: Dialect | None = None,
        instructions: str | None = None,
        voice: Voice = None,
        tts_voice: Voice = None,
        max_slice_nums: int | None = None,
        config: Mapping[str, Any] | None = None,
        recording: bool | None = None,
        **options: Unpack[ConnectOptions],
    ) -> None:
        if mode not in ("audio", "video", "chat"):
            raise ValueError("mode is audio, video or chat")
        dialect = dialect or ("v2" if mode == "chat" else "v1")
        if dialect not in ("v1", "v2") or (mode == "chat" and dialect != "v2"):
            raise ValueError("dialect is v1 or v2; chat is only in v2")
        self.mode = mode
        self.dialect: Dialect = dialect
        self._interrupt_next = False
        if mode == "chat":
            self._configure = build(SessionInit, type="session.init", payload={})
        elif dialect == "v2":
            if isinstance(voice, str) or isinstance(tts_voice, str):
                raise ValueError("the v2 dialect takes voices as audio, not ids")
            voices = {
                **voice_fields(voice, "ref_audio_base64", ""),
                **voice_fields(tts_voice, "tts_ref_audio_base64", ""),
            }
            payload = {
                "system_prompt": instructions,
                "config": dict(config) if config is not None else None,
                "voice": voices or None,
                "max_slice_nums": max_slice_nums,
                "recording": recording,
            }
            payload = {k: v for k, v in payload.items() if v is not None}
            self._configure = build(SessionInit, type="session.init", payload=payload)
        else:
            self._configure = _session_update(
                instructions, voice, tts_voice, max_slice_nums=max_slice_nums, recording=recording
            )
        super().__init__(url, **options)

    def _rules(self) -> ModeRules:
        return ModeRules(
            ready=(SessionCreated,),
            ends=(SessionClosed,),
            stop=STOP,
            stop_while_waiting=True,
            failure=closed_as_failure,
        )

    def _configure_message(self) -> Mapping[str, Any]:
        return self._configure

    def _socket_url(self) -> str:
        return ws_url(self.url, "/v1/realtime", mode=self.mode)

    # --- video and audio ---------------------------------------------------------------

    async def send(
        self, audio: np.ndarray, frames: Sequence[bytes] = (), **hints: Unpack[RealtimeHints]
    ) -> None:
        """Audio of any length (16 kHz mono float32; the server assembles 1 s
        units), with JPEG frames in video mode. ``input_id`` (v2) comes back on
        the output it produced."""
        if self.mode == "chat":
            raise ValueError("a chat session takes questions: ask()")
        force = hints.get("force_listen", False) or self._interrupt_next
        self._interrupt_next = False
        fields = {
            "audio": encode_pcm(audio),
            "video_frames": frames_b64(frames),
            "force_listen": force or None,
            "max_slice_nums": hints.get("max_slice_nums"),
        }
        if self.dialect == "v1":
            await self._send(build(Append, type="input_audio_buffer.append", **fields))
            return
        given = build(DuplexInput, **fields, input_id=hints.get("input_id"))
        await self._send(build(InputAppend, type="input.append", input=given))

    async def cancel(self) -> None:
        """Interrupt the model's speech: ``response.cancel`` in v1 (answered by
        ``ResponseCancelled``); in v2, ``force_listen`` on the next input."""
        if self.dialect == "v1":
            await self._send(build(ResponseCancel, type="response.cancel"))
        else:
            self.machine.check_sendable()
            self._interrupt_next = True

    async def update(
        self, instructions: str | None = None, voice: Voice = None, tts_voice: Voice = None
    ) -> None:
        """v1: new instructions or voice from the next turn (answered by ``SessionUpdated``)."""
        if self.dialect != "v1":
            raise ValueError("the v2 dialect configures a session once")
        await self._send(_session_update(instructions, voice, tts_voice))

    # --- chat ----------------------------------------------------------------------------

    async def ask(self, messages: Messages, **options: Any) -> ResponseDone:
        """Chat mode: one question, its whole answer (streamed audio joined in).
        It reads the session's events itself until the answer is done; the
        events it reads meanwhile are not seen by another reader.
        ``options`` are :func:`omnilive.client.chat.chat_request`'s, plus
        ``use_tts_template``; speech is off unless ``tts=True``."""
        if self.mode != "chat":
            raise ValueError("ask() is for mode='chat'")
        input_id = mint("in", 6)
        use_tts_template = options.pop("use_tts_template", None)
        request = chat_request(messages, **options)
        if use_tts_template is not None:
            request["use_tts_template"] = use_tts_template
        await self._send(build(InputAppend, type="input.append",
                               input={**request, "input_id": input_id}))  # fmt: skip
        pieces: list[np.ndarray] = []
        while True:
            event = await self.next_event()
            mine = getattr(event, "input_id", None) == input_id
            if isinstance(event, AudioDelta) and mine and event.audio is not None:
                pieces.append(event.audio)
            elif isinstance(event, ResponseDone) and mine:
                if event.audio is None and pieces:
                    return dataclasses.replace(event, audio=joined_audio(pieces))
                return event
