"""A WebRTC peer for the tests and the benchmark (aiortc): plays a clip into
its microphone track, records what the answer track plays, and reads and
writes the data channel's events."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack, VideoStreamTrack

from omnilive.audio import INPUT_RATE, resample
from omnilive.gateway.webrtc.media import set_jitter_packets
from tests.servers import Server

RATE = 48_000
PACKET = 960  # 20 ms


class ClipTrack(MediaStreamTrack):
    """A 16 kHz clip, then silence, paced at real time as a microphone is:
    each 20 ms packet goes out once its last sample has been "captured"."""

    kind = "audio"

    def __init__(self, clip: np.ndarray | None = None) -> None:
        super().__init__()
        self._samples = np.zeros(0, np.int16)
        self._pts = 0
        self._start: float | None = None
        self._clip_waiting = False
        # When the first sample of the last clip played was captured (its
        # end is that plus its length): the clock a speaker's words run on.
        self.clip_started_at: float | None = None
        if clip is not None:
            self.play(clip)

    def play(self, clip: np.ndarray) -> None:
        """Queue ``clip``; played from the next packet when nothing else is queued."""
        pcm = (np.clip(resample(clip, INPUT_RATE, RATE), -1, 1) * 32767).astype(np.int16)
        self._clip_waiting = self._samples.size == 0
        self.clip_started_at = None
        self._samples = np.concatenate([self._samples, pcm])

    @property
    def done(self) -> bool:
        return self._samples.size == 0

    @property
    def started_at(self) -> float | None:
        """When the track's first sample was captured (None: not sent yet):
        a call's whole seconds of audio count from here."""
        return self._start

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + (self._pts + PACKET) / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        out = np.zeros(PACKET, np.int16)
        take = min(PACKET, self._samples.size)
        out[:take], self._samples = self._samples[:take], self._samples[take:]
        if take and self._clip_waiting:
            self._clip_waiting = False
            self.clip_started_at = self._start + self._pts / RATE
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = RATE, self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        self._pts += PACKET
        return frame


class Camera(VideoStreamTrack):
    """Grey frames of ``width`` x ``height`` at ``fps``."""

    def __init__(self, width: int, height: int, fps: int = 5) -> None:
        super().__init__()
        self.frame = av.VideoFrame.from_ndarray(
            np.full((height, width, 3), 128, np.uint8), format="rgb24"
        )
        self.fps = fps
        self._pts = 0
        self._start: float | None = None

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._pts / self.fps - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        frame = self.frame.reformat(format="yuv420p")
        frame.pts, frame.time_base = self._pts * 90_000 // self.fps, fractions.Fraction(1, 90_000)
        self._pts += 1
        return frame


class Peer:
    """One call from the client's side."""

    def __init__(
        self,
        clip: np.ndarray | None = None,
        channel: str = "oai-events",
        camera: bool | tuple[int, int] = False,
        jitter_packets: int | None = None,
    ) -> None:
        self.jitter_packets = jitter_packets  # None: aiortc's own buffer (80 ms)
        self.pc = RTCPeerConnection()
        self.mic = ClipTrack(clip)
        if camera is True:  # aiortc's test pattern: plain green 640x480 frames at 30 fps
            self.pc.addTrack(VideoStreamTrack())
        elif camera:
            self.pc.addTrack(Camera(*camera))
        self.events: list[dict[str, Any]] = []
        self.heard: list[np.ndarray] = []  # the answer track's audio, 48 kHz mono float32
        self.first_sound_at: float | None = None
        self.sounded = asyncio.Event()
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.pc.addTrack(self.mic)
        self.channel = self.pc.createDataChannel(channel)
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        self.opened = asyncio.Event()
        self.closed = asyncio.Event()  # the channel closed (the server ended the call)
        self.channel.on("open", self.opened.set)
        self.channel.on("close", self.closed.set)
        self.call_id: str | None = None

    def _on_message(self, data: str) -> None:
        self.events.append(json.loads(data))
        self._arrived.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._record(track)))

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            samples = frame.to_ndarray().astype(np.float32).reshape(-1) / 32768.0
            if frame.layout.name == "stereo":
                samples = samples[::2]
            if self.first_sound_at is None and np.abs(samples).max() > 0.02:
                self.first_sound_at = time.monotonic()
                self.sounded.set()
            self.heard.append(samples)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def call(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST the offer to ``url``; on 201 the answer completes the connection."""
        sdp = await self.offer()
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url, content=sdp,
                headers={"Content-Type": "application/sdp", **(headers or {})}, timeout=20,
            )  # fmt: skip
        if response.status_code == 201:
            self.call_id = response.headers["location"].rsplit("/", 1)[-1]
            answer = RTCSessionDescription(response.text, "answer")
            await self.pc.setRemoteDescription(answer)
            if self.jitter_packets is not None:
                for receiver in self.pc.getReceivers():
                    set_jitter_packets(receiver, self.jitter_packets)
        return response

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def until(self, *types: str, timeout: float = 30) -> dict[str, Any]:
        """The first event of ``types`` (read or still to come)."""
        async with asyncio.timeout(timeout):
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if event.get("type") in types:
                        return event
                seen = len(self.events)
                self._arrived.clear()
                await self._arrived.wait()

    def kinds(self) -> list[str]:
        return [e.get("type", "") for e in self.events]

    def heard_audio(self) -> np.ndarray:
        return np.concatenate(self.heard) if self.heard else np.zeros(0, np.float32)

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def until_idle(server: Server, timeout: float = 10) -> None:
    """The call is gone and its worker's slot is free again."""
    async with asyncio.timeout(timeout):
        while True:
            if not (await server.get("/api/webrtc/config"))["open"]:
                break
            await asyncio.sleep(0.1)
    await server.wait_ready(timeout=timeout, workers=1)


# What a server takes to run its calls in two media processes.
MEDIA_ENV = {"OMNILIVE_WEBRTC__MEDIA_PROCESSES": "2"}


@pytest.fixture
def media_processes() -> Iterator[None]:
    """Every server the test starts runs its calls in media processes (the
    servers a test starts itself take their settings from the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in MEDIA_ENV.items():
            patch.setenv(name, value)
        yield


def media_pids(server: Server) -> list[int]:
    """The pids of the gateway's media processes (``webrtc.media_processes``)."""
    assert server.process is not None
    pid = server.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in map(int, children):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue  # it just ended
        if b"omnilive.gateway.webrtc.media_process" in command:
            found.append(child)
    return sorted(found)
