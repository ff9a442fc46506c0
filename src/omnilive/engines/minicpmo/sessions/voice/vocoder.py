"""A session's voice: its speech tokens to audio a second at a time, on the
model's one streaming vocoder (``stepaudio2.Token2wav``: a flow-matching
model, then HiFT), with stream caches of the session's own.

The vocoder's own ``stream()`` keeps one stream's caches on the object, and
some of them are views of the flow's scratch buffers, which its next call
overwrites: two sessions cannot share it as it is. :class:`FlowRunner` runs
chunks from sessions' caches and hands back new ones that are each session's
alone, with the same steps as ``stream()`` (the flow's ``inference_chunk``,
the caches cut back to the prompt plus 100 frames, HiFT with its mel and
source caches, the cross-fade, the held-back tail), the chunks of streams of
one shape as one batch (:func:`voice_together` runs many sessions' pushes in
rounds of one chunk each). On CUDA the flow estimator's blocks are CUDA
graphs (:mod:`~omnilive.engines.minicpmo.runtime.block_graphs`).
:class:`ModelCodeRunner` calls the vocoder's own ``stream()`` with the
session's caches swapped in (and copied out after, breaking the aliasing);
it serves vocoders without a flow model (the test stand-ins).

Everything here runs on the model's side lane, one call at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any, Protocol

import numpy as np

from omnilive.engines.minicpmo.runtime.tensors import clone_tensors, swapped
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import SILENCE_TOKEN
from omnilive.engines.minicpmo.sessions.voice.flow import (
    ChunkCall,
    FlowRunner,
)

log = logging.getLogger(__name__)

OUT_RATE = 24_000
VOCODER_CHUNK = 25  # speech tokens per chunk (one second)


class ChunkRunner(Protocol):
    lookahead: int

    def open(self, prompt_wav: str) -> Any:
        """A voice's state at the start of a turn (never changed after)."""

    def chunk(self, state: Any, tokens: list[int], last: bool) -> tuple[np.ndarray, Any]:
        """``tokens`` (with the lookahead, unless ``last``) to samples, and the
        state after them (``state`` itself is left as it was)."""

    def chunks(self, calls: list[ChunkCall]) -> list[tuple[np.ndarray, Any]]:
        """:meth:`chunk` of each call (of different streams), batched where
        the runner can."""


def one_by_one(runner: ChunkRunner, calls: list[ChunkCall]) -> list[tuple[np.ndarray, Any]]:
    """:meth:`ChunkRunner.chunks` for a runner that batches nothing."""
    return [runner.chunk(*call) for call in calls]


def runner_for(token2wav: Any, graphs: bool | None = None) -> ChunkRunner:
    """The runner for a loaded vocoder: the flow runner where it has a flow
    model and HiFT, else the model code's own ``stream()``."""
    flow = getattr(token2wav, "flow", None)
    if hasattr(flow, "inference_chunk") and hasattr(token2wav, "hift"):
        return FlowRunner(token2wav, graphs=graphs)
    return ModelCodeRunner(token2wav)


class VoiceStream:
    """One session's voice: the tokens not voiced yet and the vocoder state
    of the running turn, restarted from the voice's base at each turn."""

    def __init__(
        self,
        runner: ChunkRunner,
        prompt_wav: str = "",
        *,
        base: Any = None,
        whole_seconds: bool = True,
    ) -> None:
        """The voice of ``prompt_wav``, or of ``base`` (a state ``runner``
        opened before: it is only read). With ``whole_seconds`` (a duplex
        unit's audio is one second) a flushed push of less is padded in front
        to a second; without, it is handed out as it is (an answer's first
        piece, voiced early)."""
        self.runner = runner
        self.whole_seconds = whole_seconds
        self.base = base if base is not None else runner.open(prompt_wav)
        self.live: Any = None
        self.buffer: list[int] = []
        self.restart()

    def restart(self) -> None:
        self.live = self.base
        self.buffer = [SILENCE_TOKEN] * 3

    def push(self, tokens: list[int], last: bool, flush: bool) -> np.ndarray | None:
        """Voice ``tokens``: each whole second (25 tokens plus the lookahead)
        buffered so far, or with ``flush`` whatever is enough for a chunk;
        ``last`` voices the rest and restarts the turn. Under a second of
        audio (not at the end) is padded in front to one second, for a
        stream of :attr:`whole_seconds`."""
        return voice_together(self.runner, [(self, tokens, last, flush)])[0]

    def pushing(
        self, tokens: list[int], last: bool, flush: bool
    ) -> Generator[tuple[list[int], bool], np.ndarray, np.ndarray | None]:
        """:meth:`push` as a program: it yields each chunk's tokens and
        ``last`` and is sent the chunk's samples (the caller runs the chunk
        from :attr:`live` and stores the state after it there)."""
        self.buffer += tokens
        lookahead = self.runner.lookahead
        step = VOCODER_CHUNK + lookahead
        pcm: list[np.ndarray] = []
        if flush:
            while len(self.buffer) >= lookahead + 5:
                take = min(step, len(self.buffer))
                pcm.append((yield self.buffer[:take], False))
                self.buffer = self.buffer[min(VOCODER_CHUNK, take - lookahead) :]
        else:
            while len(self.buffer) >= step:
                pcm.append((yield self.buffer[:step], False))
                self.buffer = self.buffer[VOCODER_CHUNK:]
        if last and self.buffer:
            pcm.append((yield self.buffer, True))
            self.buffer = []
        if last:
            self.restart()
        if not pcm:
            return None
        samples = np.concatenate(pcm)
        if self.whole_seconds and not last and len(samples) < OUT_RATE:
            samples = np.pad(samples, (OUT_RATE - len(samples), 0))
        return samples


# One push of one stream: the stream, its tokens, ``last``, ``flush``.
Push = tuple[VoiceStream, list[int], bool, bool]


def voice_together(runner: ChunkRunner, pushes: list[Push]) -> list[np.ndarray | None]:
    """Each push's audio (:meth:`VoiceStream.push`), the pushes of different
    streams on one runner at once: in rounds, each round every unfinished
    push's next chunk, as one :meth:`ChunkRunner.chunks` call."""
    streams = [push[0] for push in pushes]
    if len({id(stream) for stream in streams}) != len(streams):
        raise ValueError("a stream's pushes run one after another, not together")
    programs = [stream.pushing(tokens, last, flush) for stream, tokens, last, flush in pushes]
    audio: list[np.ndarray | None] = [None] * len(pushes)
    asks: dict[int, tuple[list[int], bool]] = {}

    def advance(index: int, samples: np.ndarray | None) -> None:
        try:
            asks[index] = programs[index].send(samples)  # type: ignore[arg-type]  # None starts it: a generator's first send
        except StopIteration as done:
            audio[index] = done.value

    for index in range(len(programs)):
        advance(index, None)
    while asks:
        order, rounds = list(asks), asks.copy()
        asks.clear()
        made = runner.chunks([(streams[i].live, *rounds[i]) for i in order])
        for index, (samples, state) in zip(order, made, strict=True):
            streams[index].live = state
            advance(index, samples)
    return audio


# --- the model code's stream() ------------------------------------------------------------


class ModelCodeRunner:
    """The vocoder's own ``stream()`` over a session's swapped-in caches."""

    def __init__(self, token2wav: Any) -> None:
        self.token2wav = token2wav
        self.lookahead = int(token2wav.flow.pre_lookahead_len)

    def open(self, prompt_wav: str) -> dict[str, Any]:
        vocoder = self.token2wav
        state = {"cache": None, "stream_cache": None, "hift_cache_dict": {}}
        with swapped(vocoder, state):  # the caches come back into ``state``
            vocoder.stream_cache, vocoder.hift_cache_dict = vocoder.set_stream_cache(prompt_wav)
        state["prompt_wav"] = prompt_wav
        return clone_tensors(state)

    def chunks(self, calls: list[ChunkCall]) -> list[tuple[np.ndarray, Any]]:
        return one_by_one(self, calls)

    def chunk(self, state: dict[str, Any], tokens: list[int], last: bool) -> tuple[np.ndarray, Any]:
        vocoder = self.token2wav
        live = {name: value for name, value in state.items() if name != "prompt_wav"}
        with swapped(vocoder, live):
            pcm = vocoder.stream(tokens, prompt_wav=state["prompt_wav"], last_chunk=last)
        # Copies: what stream() left may be views of the flow's scratch buffers.
        after = clone_tensors(live)
        after["prompt_wav"] = state["prompt_wav"]
        return _samples(pcm), after


def _samples(pcm: Any) -> np.ndarray:
    """The vocoder's output (int16 PCM bytes, or a waveform) as float32 samples."""
    if isinstance(pcm, bytes | bytearray):
        return np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0
    if hasattr(pcm, "detach"):
        pcm = pcm.detach().float().cpu().numpy()
    return np.asarray(pcm, dtype=np.float32).reshape(-1)
