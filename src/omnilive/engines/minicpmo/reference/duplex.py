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

from omnilive.engines.appends import ContextNote
from omnilive.engines.base import EngineError
from omnilive.engines.messages import (
    ContextWindow,
    DuplexOptions,
    DuplexUnit,
    PrefillStats,
    WindowMode,
)
from omnilive.engines.minicpmo.appends import note_ids
from omnilive.engines.minicpmo.content import VoiceFile, image_of
from omnilive.engines.minicpmo.host import (
    ModelHost,
    View,
    call,
    model_errors,
    system_prompt_parts,
    to_samples,
)
from omnilive.engines.sync_views import SyncDuplexSession

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


def vision_stats(schema: list[Any]) -> tuple[int, int]:
    """Slices and embedding positions of the images fed in one unit, read from
    the model's record of what it fed (``("img", n)`` per slice)."""
    images = [entry for entry in schema if isinstance(entry, tuple) and entry[0] == "img"]
    return len(images), sum(int(entry[1]) for entry in images)


def apply_window(duplex: Any, window: ContextWindow) -> None:
    """The model code's own sliding window on its duplex object (either
    flavour: both keep it in their ``StreamDecoder``), before its prepare."""
    decoder = duplex.decoder
    config_type = type(decoder._window_config)  # the model code's DuplexWindowConfig
    decoder.set_window_config(
        config_type(
            sliding_window_mode=window.mode.value,
            basic_window_high_tokens=window.high_tokens,
            basic_window_low_tokens=window.low_tokens,
            context_previous_max_tokens=window.previous_max_tokens,
            context_max_units=window.max_units,
        )
    )
    decoder.set_window_enabled(window.mode is not WindowMode.OFF)


def window_stats(duplex: Any) -> dict[str, int]:
    """What the model code's window has done (its decoder's own counters)."""
    decoder = getattr(duplex, "decoder", None)
    dropped = getattr(decoder, "_total_dropped_units", None)
    return {} if dropped is None else {"evicted_units": int(dropped)}


def feed_between_units(duplex: Any, token_ids: list[int]) -> None:
    """Text into the model code's duplex context between two units (after
    a unit's finalize): registered as a unit of its own, so that its window
    drops it as it drops a unit, then the window enforced as
    ``finalize_unit`` does (``minicpmo/appends.py``)."""
    decoder = duplex.decoder
    decoder.register_unit_start()
    decoder.feed(decoder.embed_tokens(token_ids))
    decoder.register_unit_end(input_type="text", generated_tokens=[], is_listen=True)
    mode = decoder._window_config.sliding_window_mode
    if mode == "context":
        decoder.enforce_window_with_context()
    elif mode == "basic":
        decoder.enforce_window()


class MiniCPMoDuplex(SyncDuplexSession):
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
        apply_window(host.duplex, options.window or ContextWindow.of(host.settings.duplex_window))
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
            evicted_units=window_stats(self._host.duplex).get("evicted_units", 0),
            n_tokens=int(result.get("n_tokens", 0)),
            n_tts_tokens=int(result.get("n_tts_tokens", 0)),
            cost_llm_ms=1000 * float(result.get("cost_llm", 0.0)),
            cost_tts_prep_ms=1000 * float(result.get("cost_tts_prep", 0.0)),
            cost_tts_ms=1000 * float(result.get("cost_tts", 0.0)),
            cost_token2wav_ms=1000 * float(result.get("cost_token2wav", 0.0)),
        )

    def append(self, note: ContextNote) -> int:
        if not self._prepared:
            raise EngineError("duplex append before prepare")
        ids = note_ids(self._host.duplex.tokenizer, note)
        with model_errors("duplex append"):
            feed_between_units(self._host.duplex, ids)
        return len(ids)

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
