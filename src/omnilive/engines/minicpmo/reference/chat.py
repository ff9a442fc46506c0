"""Turn-based chat: every message prefilled into a fresh context, then one answer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from omnilive.engines.messages import ChatMessage, ChatOptions, GenerationOptions, TextAudioChunk
from omnilive.engines.minicpmo.content import content_of
from omnilive.engines.minicpmo.host import ModelHost
from omnilive.engines.minicpmo.reference.simplex import SimplexContext
from omnilive.engines.sync_views import SyncChatSession


class MiniCPMoChat(SyncChatSession):
    """One chat request: ``streaming_prefill`` per message, ``streaming_generate`` once."""

    def __init__(self, host: ModelHost, default_voice: np.ndarray | None) -> None:
        self._host = host
        self._context = SimplexContext(host, default_voice)
        self._generation = GenerationOptions()

    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        contents = [content_of(m.parts) for m in messages]  # fail before touching the model
        self._context.start(options.voice, options.tts_enabled)
        self._generation = options.generation
        length = 0
        for index, (message, content) in enumerate(zip(messages, contents, strict=True)):
            length = self._context.prefill(
                message.role,
                content,
                last=index == len(messages) - 1,
                omni_mode=options.omni_mode,
                max_slice_nums=options.max_slice_nums,
                enable_thinking=options.generation.enable_thinking,
            )
        return length

    def generate(self) -> Iterator[TextAudioChunk]:
        return self._context.answer(self._generation)

    def close(self) -> None:
        self._host.release()
