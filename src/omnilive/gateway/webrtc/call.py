"""One WebRTC call: a peer connection that the gateway's app sees as an
ordinary WebSocket session of the call's protocol.

The app is handed an ASGI ``websocket`` scope whose ``receive`` yields the
data channel's events and, from the microphone track, the protocol's own
audio messages, and whose ``send`` splits the session's messages between the
data channel and the answer track. So the route, the session path, the
queue, the per-key limits, auth (checked again on this scope), metrics and
recording are exactly the WebSocket's. Control events overtake audio: the
channel's inbox is read before the (bounded, oldest-dropped) audio backlog.

States: CONNECTING (answered, ICE/DTLS under way) → CONNECTED → CLOSED. The
call closes when its session ends, when the peer leaves or its connection
fails, when it hangs up, or when it has not connected in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from omnilive.gateway.webrtc.dialects import (
    OUTPUT_AUDIO_RATE,
    Dialect,
    Fragments,
    MediaDialect,
    client_json,
)
from omnilive.gateway.webrtc.loop_errors import quiet_closed_ice_starts
from omnilive.gateway.webrtc.media import (
    AnswerAudio,
    AnswerTrack,
    InputAudio,
    jpeg_of,
    set_jitter_packets,
)
from omnilive.gateway.webrtc.offer import (
    Offer,
    OfferError,
    OfferErrorCode,
    with_max_message_size,
)
from omnilive.session_settings import WebRTCSettings
from omnilive.wsutil import PeerGone, race

if TYPE_CHECKING:
    from av import AudioFrame

log = logging.getLogger(__name__)
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
MAX_ANSWER_AUDIO_S = 120.0  # queued answer audio; a longer backlog loses its oldest
INBOX_SIZE = 256  # data-channel events not yet read by the session
# What the session hears when the call ends: a hang-up, or the connection lost.
CLOSE_NORMAL, CLOSE_ABNORMAL = 1000, 1006
# Microphone audio resampled per thread hop: one Opus packet. Waiting to fill
# a batch delays the end of speech reaching the VAD (40 ms batches cost ~55 ms).
READ_BATCH_S = 0.02


class CallState(StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(frozen=True)
class Refused:
    """The app closed the session before accepting it (a denied upgrade)."""

    code: int
    reason: str


def ice_configuration(settings: WebRTCSettings) -> RTCConfiguration:
    servers = [
        RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
        for s in settings.ice_servers
    ]
    return RTCConfiguration(iceServers=servers)


class Call:
    """One peer connection and the session it carries."""

    def __init__(
        self,
        call_id: str,
        dialect: MediaDialect,
        settings: WebRTCSettings,
        scope: dict[str, Any],
        first_events: list[str] | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.call_id = call_id
        self.dialect = dialect
        self.settings = settings
        self.scope = scope  # the session's websocket scope
        self.state = CallState.CONNECTING
        quiet_closed_ice_starts(asyncio.get_running_loop())
        self.pc = RTCPeerConnection(ice_configuration(settings))
        self.track = AnswerTrack(MAX_ANSWER_AUDIO_S, self._playing)
        self._answer_audio = AnswerAudio(OUTPUT_AUDIO_RATE)
        self.channel: Any = None
        self.accepted: asyncio.Future[Refused | None] = asyncio.get_running_loop().create_future()
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()
        self._inbox: deque[str] = deque(first_events or [])
        self._audio: deque[str] = deque(
            maxlen=max(1, round(settings.max_audio_backlog_s / dialect.chunk_s))
        )
        self._wake = asyncio.Event()
        self._unsent: deque[str] = deque()  # server events before the channel opens
        self._fragments = Fragments(max_message_bytes)
        self._remote: list[MediaStreamTrack] = []
        self._latest_frame: Any = None
        self._connect_sent = False
        self._close_code = CLOSE_NORMAL  # what the session hears when the call ends
        self.dropped_audio_chunks = 0
        self.bytes_to_channel = 0
        self.bytes_from_channel = 0
        self.pc.on("track", self._remote.append)
        self.pc.on("datachannel", self._on_channel)
        self.pc.on("connectionstatechange", self._on_state)

    # -- signalling ---------------------------------------------------------

    async def answer(self, offer: Offer) -> str:
        """The SDP answer to ``offer``, its ICE candidates gathered; an offer
        aiortc cannot take is an :class:`OfferError` (``invalid_sdp``)."""
        try:
            return await self._answer(offer)
        except OfferError:
            raise
        except Exception as exc:
            # aiortc's parser trusts the offer: a line it did not expect
            # surfaces as whatever its code hit (an AssertionError on a cut
            # candidate, an AttributeError on a c= line it cannot read). Any
            # of them here means this client's offer cannot be answered.
            log.info("call %s: unusable offer: %r", self.call_id, exc)
            detail = str(exc) or type(exc).__name__
            raise OfferError(OfferErrorCode.INVALID_SDP, f"unusable offer: {detail}") from None

    async def _answer(self, offer: Offer) -> str:
        await self.pc.setRemoteDescription(RTCSessionDescription(offer.sdp, "offer"))
        audio = [t for t in self.pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise OfferError(OfferErrorCode.NO_AUDIO, "the offer has no audio to answer")
        for transceiver in audio:
            if not set_jitter_packets(transceiver.receiver, self.settings.jitter_packets):
                log.warning("aiortc's jitter buffer could not be set; it holds 80 ms")
        self.pc.addTrack(self.track)
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "video":
                transceiver.direction = "recvonly"  # the camera comes in; nothing goes out
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return with_max_message_size(self.pc.localDescription.sdp, self.max_message_bytes)

    async def abandon(self) -> None:
        """Close the peer connection of a call that will not run (refused,
        or its offer unusable); it may be half made."""
        self.close()
        self.track.stop()
        try:
            await self.pc.close()
        except Exception as exc:
            # aiortc closes each transport it made, and one an offer left
            # half made (no DTLS transport for a section) raises; there is
            # nothing more to free.
            log.info("call %s: closing its peer connection: %r", self.call_id, exc)

    # -- the session's ASGI face ----------------------------------------------

    async def receive(self) -> dict[str, Any]:
        if not self._connect_sent:
            self._connect_sent = True
            return {"type": "websocket.connect"}
        while True:
            if self.closed.is_set():
                return {"type": "websocket.disconnect", "code": self._close_code}
            if self._inbox:
                return {"type": "websocket.receive", "text": self._inbox.popleft()}
            if self._audio:
                return {"type": "websocket.receive", "text": self._audio.popleft()}
            self._wake.clear()
            await self._wake.wait()

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            if not self.accepted.done():
                self.accepted.set_result(None)
        elif kind == "websocket.send":
            text = message.get("text")
            if text is None:
                text = message.get("bytes", b"").decode("utf-8", "replace")
            await self._to_peer(text)
        elif kind == "websocket.close":
            if not self.accepted.done():
                self.accepted.set_result(
                    Refused(message.get("code", 1000), message.get("reason", ""))
                )
            self.close()

    async def _to_peer(self, text: str) -> None:
        out = await asyncio.to_thread(self.dialect.outbound, text)
        if out.flush:
            self.track.flush()
        if out.audio is not None and out.audio.size:
            pcm48 = await asyncio.to_thread(self._answer_audio.convert, out.audio)
            self.track.push(pcm48)
        if out.event is not None:
            self._event(out.event)

    def _event(self, text: str) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)
            self.bytes_to_channel += len(text)
            return
        if len(self._unsent) >= self.settings.max_pending_events:
            log.warning("call %s: the data channel never opened; closing", self.call_id)
            self.close()
            return
        self._unsent.append(text)

    def _playing(self, playing: bool) -> None:
        if self.dialect.dialect is Dialect.OPENAI:
            kind = "output_audio_buffer.started" if playing else "output_audio_buffer.stopped"
            self._event(json.dumps({"type": kind, "event_id": f"event_{self.call_id}"}))

    # -- the peer's side ------------------------------------------------------

    def _on_channel(self, channel: Any) -> None:
        if self.channel is not None:
            return  # one channel carries the events; others are ignored
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", self.close)
        channel.on("open", self._drain_unsent)
        if channel.readyState == "open":
            self._drain_unsent()

    def _drain_unsent(self) -> None:
        while self._unsent and self.channel.readyState == "open":
            text = self._unsent.popleft()
            self.channel.send(text)
            self.bytes_to_channel += len(text)

    def _on_message(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            self.bytes_from_channel += len(data)
            text = self._fragments.add(data)
            if text is None:
                return
        else:
            text = data
            self.bytes_from_channel += len(text)
        if self.dialect.dialect is Dialect.OPENAI and _is_clear(text):
            self.track.flush()  # OpenAI's output_audio_buffer.clear: the transport's own
            self._event(json.dumps({"type": "output_audio_buffer.cleared"}))
            return
        forwarded = self.dialect.client_event(text)
        if forwarded is None:
            return
        if len(self._inbox) >= INBOX_SIZE:
            log.warning("call %s: its session stopped reading events; closing", self.call_id)
            self.close()
            return
        self._inbox.append(forwarded)
        self._wake.set()

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.state is CallState.CONNECTING:  # never after CLOSED
            self.state = CallState.CONNECTED
            self.connected.set()
        elif state == "failed":  # the network, not the peer: the session may resume
            self.close(CLOSE_ABNORMAL)
        elif state == "closed":
            self.close()

    def close(self, code: int = CLOSE_NORMAL) -> None:
        """End the call: its session hears a disconnect (``code`` 1006, a
        connection lost, suspends a resumable session for its grace period,
        as a dropped WebSocket does); ``run`` closes the peer."""
        if not self.closed.is_set():
            self._close_code = code
        self.state = CallState.CLOSED
        self.closed.set()
        self._wake.set()

    # -- running --------------------------------------------------------------

    async def run(self, app: ASGIApp) -> None:
        """The session and the media readers until the call ends. The readers
        are cancelled once the session is over: a track whose peer never
        connected does not end when the connection closes."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch(), name=f"call-{self.call_id}-watch")
                group.create_task(self._hang_up(), name=f"call-{self.call_id}-hang-up")
                readers = [
                    group.create_task(self._reader(track), name=f"call-{self.call_id}-{track.kind}")
                    for track in self._remote
                ]
                try:
                    await app(self.scope, self.receive, self.send)
                finally:
                    self.close()
                    for reader in readers:
                        reader.cancel()
        finally:
            self.close()
            if not self.accepted.done():
                self.accepted.set_result(Refused(1011, "the call ended before its session began"))
            self.track.stop()
            for track in self._remote:
                track.stop()
            await self.pc.close()

    async def _hang_up(self) -> None:
        """Close the peer connection once the call ends, even while its app
        still runs: a session resumed on another call lives on in the app of
        the call it began in, which no longer has a peer."""
        await self.closed.wait()
        self.track.stop()
        await self.pc.close()

    def _reader(self, track: MediaStreamTrack) -> Coroutine[Any, Any, None]:
        return self._read_audio(track) if track.kind == "audio" else self._read_video(track)

    async def _watch(self) -> None:
        """Close the call if it has not connected in time; done once it did, or ended."""
        with contextlib.suppress(TimeoutError, PeerGone):
            async with asyncio.timeout(self.settings.connect_timeout_s):
                await race(self.connected.wait(), self.closed.wait)
        if not self.connected.is_set() and not self.closed.is_set():
            log.info(
                "call %s did not connect in %.0f s", self.call_id, self.settings.connect_timeout_s
            )
            self.close()
            await self.pc.close()

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        audio = InputAudio(self.dialect.input_rate, self.dialect.chunk_s, self.dialect.whole_units)
        batch: list[Any] = []
        batch_samples = 0
        while not self.closed.is_set():
            try:
                frame = cast("AudioFrame", await track.recv())  # an audio track's frames
            except MediaStreamError:
                return
            batch.append(frame)
            batch_samples += frame.samples
            if batch_samples < frame.sample_rate * READ_BATCH_S:
                continue
            frames, batch, batch_samples = batch, [], 0
            for chunk in await asyncio.to_thread(audio.convert, frames):
                if not self.dialect.takes_audio:
                    continue  # before prepared, or paused: as a page holds its microphone
                jpeg = None
                if self._latest_frame is not None:
                    jpeg = await asyncio.to_thread(
                        jpeg_of, self._latest_frame, self.dialect.frame_max_side
                    )
                    self._latest_frame = None  # one frame per unit, the freshest
                if len(self._audio) == self._audio.maxlen:
                    self.dropped_audio_chunks += 1
                self._audio.append(self.dialect.audio_message(chunk, jpeg))
                self._wake.set()

    async def _read_video(self, track: MediaStreamTrack) -> None:
        """Keeps only the freshest frame (aiortc's own queue is unbounded)."""
        while not self.closed.is_set():
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if self.dialect.dialect is Dialect.DUPLEX:
                self._latest_frame = frame


def _is_clear(text: str) -> bool:
    message = client_json(text)
    return isinstance(message, dict) and message.get("type") == "output_audio_buffer.clear"
