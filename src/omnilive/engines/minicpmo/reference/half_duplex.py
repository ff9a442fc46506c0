"""Half-duplex voice: the simplex streaming API with one session kept across turns."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from omnilive.engines.base import EngineError
from omnilive.engines.messages import HalfDuplexOptions, Part, TextAudioChunk
from omnilive.engines.minicpmo.content import content_of
from omnilive.engines.minicpmo.host import ContextMark, ModelHost, model_errors
from omnilive.engines.minicpmo.reference.simplex import SimplexContext
from omnilive.engines.sync_views import SyncHalfDuplexSession


class MiniCPMoHalfDuplex(SyncHalfDuplexSession):
    """System content once, then per turn the user's speech and a streamed answer.

    The context lives in the model's KV cache under one session id, so each
    turn costs only its own speech and answer. ``snapshot`` remembers the
    cache length before a turn; ``rollback`` cuts the cache back to it.
    """

    def __init__(self, host: ModelHost, default_voice: np.ndarray | None) -> None:
        self._host = host
        self._context = SimplexContext(host, default_voice)
        self._options = HalfDuplexOptions()
        self._mark: ContextMark | None = None
        self._prepared = False
        self._pending = False

    def prepare(self, system: list[Part], options: HalfDuplexOptions) -> int:
        content = content_of(system)
        self._options = options
        self._context.start(options.voice, options.tts_enabled)
        length = self._context.prefill("system", content, last=False)
        self._prepared = True
        return length

    def prefill(self, speech: np.ndarray) -> int:
        if not self._prepared:
            raise EngineError("half-duplex prefill before prepare")
        before = self._host.simplex_kv()
        after = self._context.prefill("user", [np.asarray(speech, dtype=np.float32)], last=True)
        self._pending = True
        return after - before

    def generate(self) -> Iterator[TextAudioChunk]:
        if not self._pending:
            raise EngineError("generate before prefill")
        self._pending = False
        return self._context.answer(self._options.generation)

    def snapshot(self) -> None:
        self._mark = self._host.mark()

    def rollback(self) -> None:
        if self._mark is not None:
            with model_errors("rollback"):
                self._host.restore(self._mark)
        self._pending = False

    def close(self) -> None:
        self._mark = None
        self._host.release()
