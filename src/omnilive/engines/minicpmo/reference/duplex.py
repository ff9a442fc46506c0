"""Full duplex through the model's duplex object (``as_duplex()`` / ``model.duplex``).

Per 1 s unit: ``streaming_prefill(audio_waveform, frame_list, max_slice_nums)``
feeds ``<unit>``, the frames and the audio; ``streaming_generate(...)`` decides
to listen or to speak up to ``max_new_speak_tokens_per_chunk`` tokens (and
voices them); ``finalize_unit()`` closes the unit, after the result was sent.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from omnilive.engines.base import DuplexSession, EngineError
from omnilive.engines.messages import DuplexOptions, DuplexUnit, PrefillStats
from omnilive.engines.minicpmo.content import VoiceFile, image_of
from omnilive.engines.minicpmo.reference.host import (
    Flavour,
    ModelHost,
    View,
    call,
    model_errors,
    to_samples,
)

# The reference implementation's sampling for duplex units.
SAMPLING = {
    "decode_mode": "sampling",
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "text_repetition_penalty": 1.05,
    "text_repetition_window_size": 512,
    "length_penalty": 1.1,
}


def system_prompt_parts(host: ModelHost, prompt: str, with_voice: bool) -> tuple[str, str | None]:
    """Prefix and suffix of the duplex system turn.

    The checkpoint's code wraps the plain prompt in the chat template itself;
    the demo's unified code takes it already wrapped, with the voice between
    ``<|audio_start|>`` and ``<|audio_end|>``.
    """
    if host.flavour is Flavour.AS_DUPLEX:
        return prompt, None
    if with_voice:
        return f"<|im_start|>system\n{prompt}\n<|audio_start|>", "<|audio_end|><|im_end|>"
    return f"<|im_start|>system\n{prompt}", "<|im_end|>"


def vision_stats(schema: list[Any]) -> tuple[int, int]:
    """Slices and embedding positions of the images fed in one unit, read from
    the model's record of what it fed (``("img", n)`` per slice)."""
    images = [entry for entry in schema if isinstance(entry, tuple) and entry[0] == "img"]
    return len(images), sum(int(entry[1]) for entry in images)


class MiniCPMoDuplex(DuplexSession):
    """One audio or omni duplex session on the shared model."""

    def __init__(
        self,
        host: ModelHost,
        default_voice: np.ndarray | None,
        force_listen_units: int | None = None,
    ) -> None:
        self._host = host
        self._default_voice = default_voice
        settings = host.settings
        self._force_listen_units = (
            settings.force_listen_units if force_listen_units is None else force_listen_units
        )
        self._voice_file: VoiceFile | None = None
        self._units = 0
        self._prepared = False

    def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        with model_errors("duplex prepare"):
            return self._prepare(system_prompt, options)

    def _prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        host = self._host
        host.begin(View.DUPLEX)
        llm_voice = options.llm_voice.reference if options.llm_voice else None
        tts_voice = options.tts_voice.reference if options.tts_voice else None
        llm_voice = llm_voice if llm_voice is not None else self._default_voice
        tts_voice = tts_voice if tts_voice is not None else llm_voice
        self._close_voice()
        if tts_voice is not None and host.settings.audio_output:
            self._voice_file = VoiceFile(tts_voice)
        prefix, suffix = system_prompt_parts(host, system_prompt, llm_voice is not None)
        call(
            host.duplex.prepare,
            prefix_system_prompt=prefix,
            suffix_system_prompt=suffix,
            ref_audio=llm_voice,
            prompt_wav_path=str(self._voice_file.path) if self._voice_file else None,
        )
        self._units = 0
        self._prepared = True
        return host.duplex_kv()

    def prefill(
        self, audio: np.ndarray, frames: list[bytes], max_slice_nums: int | None = None
    ) -> PrefillStats:
        if not self._prepared:
            raise EngineError("duplex prefill before prepare")
        images = [image_of(frame) for frame in frames]
        started = time.perf_counter()
        kv_before = self._host.duplex_kv()
        with model_errors("duplex prefill"):
            result = call(
                self._host.duplex.streaming_prefill,
                audio_waveform=np.asarray(audio, dtype=np.float32),
                frame_list=images or None,
                max_slice_nums=max_slice_nums or 1,
            )
        cost_ms = (time.perf_counter() - started) * 1000
        slices, tokens = 0, 0
        schema = getattr(self._host.duplex, "prefill_schema_tokens", None)
        if images and schema:
            slices, tokens = vision_stats(schema[-1])
        if isinstance(result, dict) and "cost_all" in result:
            cost_ms = float(result["cost_all"]) * 1000
        # Usage: the model code's own counts where it reports them; otherwise
        # every position the prefill added that is not vision counts as audio.
        counts = result.get("usage", result) if isinstance(result, dict) else {}
        added = max(0, self._host.duplex_kv() - kv_before)
        return PrefillStats(
            vision_slices=slices,
            vision_tokens=tokens,
            audio_tokens=int(counts.get("input_audio_tokens", max(0, added - tokens))),
            text_tokens=int(counts.get("input_text_tokens", 0)),
            cost_ms=cost_ms,
        )

    def generate(self, force_listen: bool = False) -> DuplexUnit:
        if not self._prepared:
            raise EngineError("duplex generate before prepare")
        forced = force_listen or self._units < self._force_listen_units
        self._units += 1
        with model_errors("duplex generate"):
            result = self._host.duplex_generate(
                forced,
                max_new_speak_tokens_per_chunk=self._host.settings.max_speak_tokens_per_unit,
                **SAMPLING,
            )
        is_listen = bool(result.get("is_listen", True))
        audio = None if is_listen else to_samples(result.get("audio_waveform"))
        return DuplexUnit(
            is_listen=is_listen,
            text="" if is_listen else str(result.get("text") or ""),
            audio=audio,
            end_of_turn=bool(result.get("end_of_turn", False)),
            kv_cache_length=self._host.duplex_kv(),
            n_tokens=int(result.get("n_tokens", 0)),
            n_tts_tokens=int(result.get("n_tts_tokens", 0)),
            cost_llm_ms=1000 * float(result.get("cost_llm", 0.0)),
            cost_tts_prep_ms=1000 * float(result.get("cost_tts_prep", 0.0)),
            cost_tts_ms=1000 * float(result.get("cost_tts", 0.0)),
            cost_token2wav_ms=1000 * float(result.get("cost_token2wav", 0.0)),
        )

    def finalize(self) -> None:
        # The checkpoint's older code closes the unit inside streaming_generate;
        # the newer one defers it to finalize_unit so the result goes out first.
        finalize = getattr(self._host.duplex, "finalize_unit", None)
        if finalize is not None and getattr(self._host.duplex, "needs_finalize", True):
            with model_errors("duplex finalize"):
                finalize()

    def close(self) -> None:
        self._prepared = False
        self._close_voice()
        self._host.release()

    def _close_voice(self) -> None:
        if self._voice_file is not None:
            self._voice_file.close()
            self._voice_file = None
