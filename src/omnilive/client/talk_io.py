"""Where ``omnilive talk`` hears and speaks: a microphone and a speaker
(``sounddevice``, the ``talk`` extra), or WAV files.

Sources hand out 16 kHz float32 blocks as time passes; sinks take the model's
24 kHz speech. Both sides are bounded: a microphone the session cannot keep
up with drops its oldest blocks, a speaker holds at most a minute of speech.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from omnilive.client.audio import INPUT_RATE, OUTPUT_RATE, load_wav, silence, write_wav

BLOCK_S = 0.1
MAX_MIC_BLOCKS = 50  # 5 s of microphone audio waiting for the session
MAX_SPEAKER_S = 60.0
MISSING_SOUNDDEVICE = (
    "the microphone and speaker need sounddevice: pip install 'omnilive[talk]' "
    "(or talk through files: --input FILE.wav --output FILE.wav)"
)


class DevicesUnavailable(Exception):
    """No sounddevice, or no usable audio device."""


def sounddevice() -> Any:
    """The ``sounddevice`` module, imported only when a device is needed."""
    try:
        import sounddevice as sd
    except ImportError:
        raise DevicesUnavailable(MISSING_SOUNDDEVICE) from None
    except OSError as exc:  # PortAudio itself is missing
        raise DevicesUnavailable(f"sounddevice cannot load PortAudio: {exc}") from None
    return sd


class Source(Protocol):
    live: bool  # a microphone (True) or a file played in real time

    def blocks(self) -> AsyncIterator[np.ndarray]: ...

    @property
    def input_done(self) -> bool:
        """Everything the user meant to say has been handed out (files only)."""
        ...

    def close(self) -> None: ...


class Sink(Protocol):
    def play(self, audio: np.ndarray) -> None: ...

    def flush(self) -> None:
        """Drop what has not been played yet (the model was interrupted)."""

    def remaining_s(self) -> float: ...

    def close(self) -> None: ...


class FileSource:
    """A WAV file in real time, in 0.1 s blocks: a little silence first (what
    a microphone gives before you speak), the file, then ``tail_s`` of
    silence, then silence for as long as ``endless`` asks (duplex sessions
    need audio every second while the model answers)."""

    live = False

    def __init__(
        self, path: Path, lead_s: float = 0.5, tail_s: float = 2.0, endless: bool = False
    ) -> None:
        self.speech = load_wav(path, INPUT_RATE)
        self.audio = np.concatenate([silence(lead_s), self.speech, silence(tail_s)])
        self.speech_end_s = lead_s + self.speech.size / INPUT_RATE
        self.endless = endless
        self._done = False

    @property
    def input_done(self) -> bool:
        return self._done

    async def blocks(self) -> AsyncIterator[np.ndarray]:
        size = round(BLOCK_S * INPUT_RATE)
        started = time.monotonic()
        sent = 0
        while True:
            block = self.audio[sent : sent + size]
            if block.size == 0:
                self._done = True
                if not self.endless:
                    return
                block = silence(BLOCK_S)
            sent += size
            yield block
            await asyncio.sleep(max(0.0, started + sent / INPUT_RATE - time.monotonic()))

    def close(self) -> None:
        """Nothing to release: the file was read at once."""


class Microphone:
    """The default input device at 16 kHz, mono, in 0.1 s blocks."""

    live = True
    input_done = False

    def __init__(self) -> None:
        self._blocks: collections.deque[np.ndarray] = collections.deque(maxlen=MAX_MIC_BLOCKS)
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        sd = sounddevice()
        try:
            self._stream = sd.InputStream(
                samplerate=INPUT_RATE,
                channels=1,
                dtype="float32",
                blocksize=round(BLOCK_S * INPUT_RATE),
                callback=self._callback,
            )
            self._stream.start()
        except Exception as exc:  # PortAudio reports missing devices in many ways
            raise DevicesUnavailable(f"cannot open the microphone: {exc}") from None

    def _callback(self, data: np.ndarray, frames: int, when: Any, status: Any) -> None:
        block = data[:, 0].copy()  # on PortAudio's thread: hand over, nothing more
        self._loop.call_soon_threadsafe(self._arrive, block)

    def _arrive(self, block: np.ndarray) -> None:
        self._blocks.append(block)  # the deque drops the oldest beyond its bound
        self._arrived.set()

    def drain(self) -> None:
        """Forget what was heard so far (e.g. before recording a question)."""
        self._blocks.clear()

    async def blocks(self) -> AsyncIterator[np.ndarray]:
        while True:
            while not self._blocks:
                self._arrived.clear()
                await self._arrived.wait()
            yield self._blocks.popleft()

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()


class Speaker:
    """The default output device at 24 kHz. PortAudio's thread pulls from a
    locked queue of pieces; ``flush`` empties it at once."""

    def __init__(self) -> None:
        self._pieces: collections.deque[np.ndarray] = collections.deque()
        self._queued = 0  # samples
        self._lock = threading.Lock()
        sd = sounddevice()
        try:
            self._stream = sd.OutputStream(
                samplerate=OUTPUT_RATE, channels=1, dtype="float32", callback=self._callback
            )
            self._stream.start()
        except Exception as exc:
            raise DevicesUnavailable(f"cannot open the speaker: {exc}") from None

    def _callback(self, out: np.ndarray, frames: int, when: Any, status: Any) -> None:
        filled = 0
        with self._lock:
            while filled < frames and self._pieces:
                piece = self._pieces[0]
                take = min(frames - filled, piece.size)
                out[filled : filled + take, 0] = piece[:take]
                filled += take
                self._queued -= take
                if take == piece.size:
                    self._pieces.popleft()
                else:
                    self._pieces[0] = piece[take:]
        out[filled:, 0] = 0.0

    def play(self, audio: np.ndarray) -> None:
        with self._lock:
            self._pieces.append(np.asarray(audio, dtype=np.float32))
            self._queued += audio.size
            while self._queued > MAX_SPEAKER_S * OUTPUT_RATE and len(self._pieces) > 1:
                self._queued -= self._pieces.popleft().size

    def flush(self) -> None:
        with self._lock:
            self._pieces.clear()
            self._queued = 0

    def remaining_s(self) -> float:
        with self._lock:
            return self._queued / OUTPUT_RATE

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()


class FileSink:
    """The model's speech, one answer after the other, written as a WAV file on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pieces: list[np.ndarray] = []

    def play(self, audio: np.ndarray) -> None:
        self._pieces.append(np.asarray(audio, dtype=np.float32))

    def flush(self) -> None:
        """A file keeps what the model said before it was interrupted."""

    def remaining_s(self) -> float:
        return 0.0

    @property
    def seconds(self) -> float:
        return sum(p.size for p in self._pieces) / OUTPUT_RATE

    def close(self) -> None:
        audio = np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.float32)
        write_wav(self.path, audio, OUTPUT_RATE)


class StdinLines:
    """Lines typed on stdin, read on the event loop: a thread blocked in
    ``input()`` would keep Ctrl-C from ending the program."""

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.BaseTransport | None = None

    async def next(self) -> str | None:
        """The next line, or None at the end of input."""
        if self._reader is None:
            self._reader = asyncio.StreamReader()
            protocol = asyncio.StreamReaderProtocol(self._reader)
            loop = asyncio.get_running_loop()
            self._transport, _ = await loop.connect_read_pipe(lambda: protocol, sys.stdin)
        line = await self._reader.readline()
        return line.decode(errors="replace").rstrip("\n") if line else None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
