"""Audio and video between aiortc's tracks and a session's messages.

Opus coding is aiortc's, off the event loop (its decoder thread, its encoder
in the loop's executor). Resampling and JPEG encoding happen here, in
``asyncio.to_thread``, once per chunk rather than once per 20 ms packet.
"""

from __future__ import annotations

import asyncio
import fractions
import io
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer, JitterFrame, uint16_add
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket

OPUS_RATE = 48_000
PACKET_S = 0.02  # what a browser's Opus encoder packs, and what the track sends
PACKET_SAMPLES = int(OPUS_RATE * PACKET_S)
JPEG_QUALITY = 80


class InOrderAudio(JitterBuffer):
    """An audio jitter buffer that holds nothing: each Opus packet is a whole
    frame, handed on as it arrives. aiortc's own (built for video frames of
    many packets) releases a frame only once the next one's first packet has
    come, which adds a packet (20 ms) to every end of speech even with no
    prefetch. A packet older than one already handed on is dropped (reordered
    on the network); a lost one is a gap, which the VAD and the ASR take as it
    is."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity=capacity)
        self._next: int | None = None

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        if self._next is not None and uint16_add(packet.sequence_number, -self._next) >= 0x8000:
            return False, None  # late: its successors were decoded already
        self._next = uint16_add(packet.sequence_number, 1)
        data = getattr(packet, "_data", packet.payload)  # depayloaded by the receiver
        return False, JitterFrame(data=data, timestamp=packet.timestamp)


def set_jitter_packets(receiver: RTCRtpReceiver, packets: int) -> bool:
    """Hold ``packets`` Opus packets (20 ms each) against network jitter and
    reordering instead of aiortc's fixed 4 (80 ms, all of it added to every
    turn's end of speech); 0: none (:class:`InOrderAudio`). aiortc has no
    option for it: its private buffer is replaced before the first packet;
    False (and aiortc's own kept) if that changed."""
    name = "_RTCRtpReceiver__jitter_buffer"
    current = getattr(receiver, name, None)
    if not isinstance(current, JitterBuffer) or receiver.track.kind != "audio":
        return False
    buffer = (
        InOrderAudio(current.capacity)
        if packets == 0
        else JitterBuffer(capacity=current.capacity, prefetch=packets)
    )
    setattr(receiver, name, buffer)
    return True


class InputAudio:
    """Decoded Opus frames (48 kHz, any layout) to mono float32 chunks at
    ``rate``, each ``chunk_s`` long. One resampler, used by one task."""

    def __init__(self, rate: int, chunk_s: float, whole: bool = True) -> None:
        self.rate = rate
        self.chunk_samples = round(rate * chunk_s)
        self.whole = whole  # False: hand over what there is at once (no waiting to fill)
        # Stereo, then the channels' mean: FFmpeg's own downmix adds 3 dB to
        # the two equal channels Opus decodes a browser's mono microphone to.
        self._resampler = av.AudioResampler(format="fltp", layout="stereo", rate=rate)
        self._pending = np.zeros(0, dtype=np.float32)

    def convert(self, frames: list[av.AudioFrame]) -> list[np.ndarray]:
        """Whole chunks made from ``frames`` (call it off the event loop)."""
        parts = [self._pending]
        for frame in frames:
            for out in self._resampler.resample(frame):
                parts.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
        samples = np.concatenate(parts)
        if not self.whole:
            self._pending = samples[:0]
            return [samples] if samples.size else []
        whole = samples.size // self.chunk_samples * self.chunk_samples
        self._pending = samples[whole:].copy()
        return [samples[i : i + self.chunk_samples] for i in range(0, whole, self.chunk_samples)]


def jpeg_of(frame: av.VideoFrame, max_side: int) -> bytes:
    """One camera frame as the JPEG a duplex chunk carries, at most
    ``max_side`` pixels wide and high (off the loop)."""
    image = frame.to_image()
    image.thumbnail((max_side, max_side))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


class AnswerAudio:
    """Answer audio (mono float32 at ``rate``) as 48 kHz int16 for the track.
    One resampler for the whole answer stream: the pieces are one signal, and
    resampling each alone would click at every seam."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=OPUS_RATE)

    def convert(self, samples: np.ndarray) -> np.ndarray:
        """Call it off the event loop, one piece at a time."""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1),
            format="flt",
            layout="mono",
        )
        frame.sample_rate = self.rate
        parts = [out.to_ndarray().reshape(-1) for out in self._resampler.resample(frame)]
        return np.concatenate(parts).astype(np.int16) if parts else np.zeros(0, np.int16)


class AnswerTrack(MediaStreamTrack):
    """The answer's audio, paced at real time in 20 ms packets; silence when
    there is none. Bounded: past ``max_s`` queued, the oldest audio is
    dropped and counted. ``flush()`` drops it all (barge-in). ``on_playing``
    hears True when audio starts after silence and False when it runs out."""

    kind = "audio"

    def __init__(self, max_s: float, on_playing: Callable[[bool], None] | None = None) -> None:
        super().__init__()
        self._buffer: deque[np.ndarray] = deque()
        self._queued = 0
        self._max = int(max_s * OPUS_RATE)
        self._start: float | None = None
        self._pts = 0
        self._playing = False
        self._on_playing = on_playing
        self.dropped_samples = 0
        self.sent_samples = 0

    @property
    def queued_s(self) -> float:
        return self._queued / OPUS_RATE

    def push(self, pcm48: np.ndarray) -> None:
        if pcm48.size == 0:
            return
        self._buffer.append(pcm48)
        self._queued += pcm48.size
        while self._queued > self._max and self._buffer:
            old = self._buffer.popleft()
            self._queued -= old.size
            self.dropped_samples += old.size

    def flush(self) -> None:
        self._buffer.clear()
        self._queued = 0

    def _take(self, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.int16)
        filled = 0
        while filled < n and self._buffer:
            head = self._buffer[0]
            take = min(n - filled, head.size)
            out[filled : filled + take] = head[:take]
            filled += take
            if take == head.size:
                self._buffer.popleft()
            else:
                self._buffer[0] = head[take:]
        self._queued -= filled
        self.sent_samples += filled
        self._tell(filled > 0)
        return out

    def _tell(self, playing: bool) -> None:
        if playing != self._playing:
            self._playing = playing
            if self._on_playing is not None:
                self._on_playing(playing)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            wait = self._start + self._pts / OPUS_RATE - now
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -0.2:  # the sender stalled: resync rather than burst
                self._start = now - self._pts / OPUS_RATE
        samples = self._take(PACKET_SAMPLES)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, OPUS_RATE)
        self._pts += PACKET_SAMPLES
        return frame
