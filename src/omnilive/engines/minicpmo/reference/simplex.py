"""The simplex streaming API shared by chat and half-duplex.

One conversation is one ``session_id`` of the model's streaming API:
``streaming_prefill(session_id, msgs=[one message])`` appends to its KV cache
(a new id starts a fresh context) and ``streaming_generate(session_id,
generate_audio=...)`` streams the answer, as ``(waveform, text)`` pairs with
audio or ``(text, finished)`` pairs without.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np

from omnilive.engines.messages import GenerationOptions, TextAudioChunk, Voice
from omnilive.engines.minicpmo.host import ModelHost, View, call, model_errors, to_samples

log = logging.getLogger(__name__)


class SimplexContext:
    """A session of the simplex API on the shared model."""

    def __init__(self, host: ModelHost, default_voice: np.ndarray | None) -> None:
        self.host = host
        self.default_voice = default_voice
        self.session_id = f"omnilive-{secrets.token_hex(6)}"
        self.audio = False
        self.use_tts_template = False

    def start(self, voice: Voice | None, want_audio: bool) -> None:
        """Reset the model for this session and set up its voice."""
        with model_errors("reset"):
            self.host.begin(View.SIMPLEX)
        reference = voice.reference if voice is not None else None
        if reference is None:
            reference = self.default_voice
        self.audio = want_audio and self.host.settings.audio_output
        if self.audio and reference is None:
            # The speech decoder clones a voice; with none to clone the answer
            # can only be text. Said once per session, in the worker's log.
            log.warning("no reference voice (request or minicpmo.default_voice): text only")
            self.audio = False
        if self.audio:
            with model_errors("voice set-up"):
                self.host.set_voice(reference)  # type: ignore[arg-type]  # not None: audio is off without a voice
        self.use_tts_template = self.audio

    def prefill(
        self,
        role: str,
        content: list[Any],
        *,
        last: bool,
        omni_mode: bool = False,
        max_slice_nums: int | None = None,
        enable_thinking: bool = False,
    ) -> int:
        """Append one message; returns the context length after it."""
        with model_errors("prefill"):
            self._prefill(role, content, last, omni_mode, max_slice_nums, enable_thinking)
        return self.host.simplex_kv()

    def _prefill(
        self,
        role: str,
        content: list[Any],
        last: bool,
        omni_mode: bool,
        max_slice_nums: int | None,
        enable_thinking: bool,
    ) -> None:
        call(
            self.host.model.streaming_prefill,
            session_id=self.session_id,
            msgs=[{"role": role, "content": content}],
            omni_mode=omni_mode,
            max_slice_nums=max_slice_nums,
            use_tts_template=self.use_tts_template,
            enable_thinking=enable_thinking,
            is_last_chunk=last,
            # Whole recordings, not a live stream: the encoder sees each
            # segment at once rather than in 1 s windows.
            stream_input=False,
        )

    def answer(self, generation: GenerationOptions) -> Iterator[TextAudioChunk]:
        """Stream the answer; ``n_tokens`` is what each piece added to the context."""
        with model_errors("generate"):
            yield from self._answer(generation)

    def _answer(self, generation: GenerationOptions) -> Iterator[TextAudioChunk]:
        before = self.host.simplex_kv()
        items = call(
            self.host.model.streaming_generate,
            session_id=self.session_id,
            generate_audio=self.audio,
            max_new_tokens=generation.max_new_tokens,
            do_sample=not generation.greedy,
            temperature=generation.temperature,
            top_p=generation.top_p,
            length_penalty=generation.length_penalty,
            enable_thinking=generation.enable_thinking,
            use_tts_template=self.use_tts_template,
        )
        try:
            for item in items:
                if item is None or len(item) < 2:
                    continue
                if self.audio:
                    samples, text = to_samples(item[0]), item[1]
                else:
                    samples, text = None, item[0]
                text = text if isinstance(text, str) else ""
                if not text and samples is None:
                    continue
                now = self.host.simplex_kv()
                tokens, before = max(0, now - before), now
                yield TextAudioChunk(text=text, audio=samples, n_tokens=tokens)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
