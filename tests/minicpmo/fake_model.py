"""A pure-Python stand-in for MiniCPM-o 4.5's model object.

It implements the public methods the engine calls, with the argument names and
return shapes of the published model code (read from the public
MiniCPM-o-Demo ``MiniCPMO45/`` sources, not copied): the simplex streaming API
(``streaming_prefill(session_id, msgs)`` one message at a time,
``streaming_generate`` yielding ``(waveform, text)`` or ``(text, finished)``),
the duplex object (``prepare`` / ``streaming_prefill`` / ``streaming_generate``
returning the result dict / ``finalize_unit``), ``reset_session``,
``init_token2wav_cache`` and a KV cache with ``get_seq_length`` and ``crop``.

"Tokens" are counted, not computed: text one per word, audio ten per second,
an image 64 positions plus its two markers. ``live`` counts the tensors a real
model would hold on the GPU, so tests can check nothing outlives a session.
"""

from __future__ import annotations

import wave
from enum import Enum
from types import SimpleNamespace
from typing import Any

import numpy as np
from PIL import Image

from tests.minicpmo.fake_decoder import FakeCache, FakeDecoder

OUT_RATE = 24_000


class ProcessorMode(Enum):
    """The unified code's view switch (looked up on the model's module)."""

    CHAT = "chat"
    STREAMING = "streaming"
    DUPLEX = "duplex"


def tokens_of(item: Any) -> int:
    if isinstance(item, str):
        return len(item.split()) + 1
    if isinstance(item, np.ndarray):
        assert item.dtype == np.float32 and item.ndim == 1, (item.dtype, item.shape)
        return max(1, round(item.size / 16000 * 10))
    if isinstance(item, Image.Image):
        assert item.mode == "RGB"
        return 66
    raise TypeError(f"content the model cannot take: {type(item).__name__}")


class FakeDuplex:
    """``as_duplex()``'s object: the per-unit API over the model's weights.

    ``plan`` decides each unit, cycled: ``L`` listen, ``S`` speak, ``E`` speak
    and end the turn (what a trained model would decide from the audio)."""

    def __init__(self, model: FakeMiniCPMO, generate_audio: bool = True) -> None:
        self.model = model
        self.generate_audio = generate_audio
        self.decoder = FakeDecoder()
        self.plan = "S"
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_in: str | None = None
        self.break_set = False
        self._reset_streaming_state()

    def _reset_streaming_state(self) -> None:
        self.audio_chunk_idx = 0
        self.current_turn_ended = True
        self.pending_logits: str | None = None
        self.total_hidden: list[int] = []
        self.tts_past_key_values: list[int] | None = None
        self.prefill_schema_tokens: list[list[Any]] = []
        self._pending_finalize: dict[str, Any] | None = None
        self._cursor = 0
        self.voice_path: str | None = None

    @property
    def needs_finalize(self) -> bool:
        return self._pending_finalize is not None

    def prepare(
        self,
        prefix_system_prompt: str | None = None,
        suffix_system_prompt: str | None = None,
        ref_audio: np.ndarray | None = None,
        prompt_wav_path: str | None = None,
        context_previous_marker: str = "\n\nprevious: ",
    ) -> str:
        self.calls.append(("prepare", {"prefix": prefix_system_prompt,
                                       "suffix": suffix_system_prompt,
                                       "ref_audio": ref_audio,
                                       "prompt_wav_path": prompt_wav_path}))  # fmt: skip
        self._reset_streaming_state()
        self.decoder.reset()
        if prompt_wav_path and self.generate_audio:
            with wave.open(prompt_wav_path, "rb") as voice:  # the real code reads the file
                assert voice.getframerate() == 16000 and voice.getnframes() > 0
            self.voice_path = prompt_wav_path
        if prefix_system_prompt:
            self.decoder.feed("system", tokens_of(prefix_system_prompt))
        if ref_audio is not None:
            self.decoder.feed("voice", tokens_of(ref_audio))
        if suffix_system_prompt:
            self.decoder.feed("system", tokens_of(suffix_system_prompt))
        return (prefix_system_prompt or "") + (suffix_system_prompt or "")

    def streaming_prefill(
        self,
        audio_waveform: np.ndarray | None = None,
        frame_list: list[Image.Image] | None = None,
        max_slice_nums: int = 1,
        batch_vision_feed: bool = False,
    ) -> dict[str, Any]:
        if self.needs_finalize:
            raise RuntimeError("streaming_prefill called before finalize_unit()")
        if self.fail_in == "prefill":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self.calls.append(("prefill", {"frames": len(frame_list or []),
                                       "max_slice_nums": max_slice_nums}))  # fmt: skip
        schema: list[Any] = ["<unit>"]
        self.decoder.unit_started()
        self.decoder.feed("unit", 1)
        for frame in frame_list or []:
            assert isinstance(frame, Image.Image) and frame.mode == "RGB"
            for _ in range(max_slice_nums):  # the fake slices every frame this many times
                self.decoder.feed("image", 66)
                schema += ["<image>", ("img", 64), "</image>"]
        if audio_waveform is not None and audio_waveform.size:
            n = tokens_of(audio_waveform)
            self.decoder.feed("audio", n)
            schema.append(("audio", n))
        self.prefill_schema_tokens.append(schema)
        self.pending_logits = "logits"
        self.audio_chunk_idx += 1
        return {"success": True, "cost_all": 0.004, "cost_audio_embed": 0.001}

    def streaming_generate(
        self,
        prompt_wav_path: str | None = None,
        max_new_speak_tokens_per_chunk: int = 20,
        decode_mode: str = "sampling",
        temperature: float = 0.7,
        top_k: int = 20,
        top_p: float = 0.8,
        listen_prob_scale: float = 1.0,
        listen_top_k: int | None = None,
        text_repetition_penalty: float = 1.05,
        text_repetition_window_size: int = 512,
        length_penalty: float = 1.1,
        force_listen_override: bool = False,
    ) -> dict[str, Any]:
        if self.fail_in == "generate":
            raise RuntimeError("CUDA out of memory")
        self.calls.append(("generate", {"force_listen": force_listen_override,
                                        "max_speak": max_new_speak_tokens_per_chunk,
                                        "decode_mode": decode_mode}))  # fmt: skip
        if self.pending_logits is None:
            return self._result(is_listen=True)
        self.pending_logits = None
        plan = self.plan[self._cursor % len(self.plan)]
        self._cursor += 1
        if force_listen_override or self.break_set:
            if not self.current_turn_ended:
                self.decoder.feed("turn_eos", 1)
                self.current_turn_ended = True
            plan = "L"
        if plan == "L":
            self._pending_finalize = {"terminator": "listen", "spoken": 0}
            self.total_hidden.append(0)
            return self._result(is_listen=True)
        n = max(1, max_new_speak_tokens_per_chunk - 2)
        self.decoder.feed("speak", n)
        end = plan == "E"
        self.current_turn_ended = end
        self.total_hidden.append(n)
        self.tts_past_key_values = None if end else [n]
        self._pending_finalize = {"terminator": "chunk_eos", "spoken": n}
        words = " ".join(f"w{self.audio_chunk_idx}.{i}" for i in range(n))
        audio = None
        if self.generate_audio and self.voice_path:
            audio = np.full(OUT_RATE, 0.1, np.float32)  # 25 speech tokens = 1 s
        return self._result(False, words, audio, end, n_tokens=n, n_tts_tokens=25)

    def _result(
        self,
        is_listen: bool,
        text: str = "",
        audio: np.ndarray | None = None,
        end_of_turn: bool = False,
        n_tokens: int = 0,
        n_tts_tokens: int = 0,
    ) -> dict[str, Any]:
        return {
            "is_listen": is_listen,
            "text": text,
            "audio_waveform": audio if audio is not None else np.zeros(OUT_RATE, np.float32),
            "end_of_turn": end_of_turn,
            "current_time": self.audio_chunk_idx,
            "cost_llm": 0.020,
            "cost_tts_prep": 0.001 if not is_listen else 0.0,
            "cost_tts": 0.010 if not is_listen else 0.0,
            "cost_token2wav": 0.005 if not is_listen else 0.0,
            "cost_all": 0.036,
            "n_tokens": n_tokens,
            "n_tts_tokens": n_tts_tokens,
        }

    def finalize_unit(self) -> None:
        if self._pending_finalize is None:
            return
        self.calls.append(("finalize", {}))
        self.decoder.feed("unit_end", 2)
        self.decoder.unit_ended(self._pending_finalize.get("spoken", 0))
        self._pending_finalize = None

    def set_break_event(self) -> None:
        self.break_set = True

    def clear_break_event(self) -> None:
        self.break_set = False


class FakeToken2wav:
    """The streaming vocoder's prompt state: what ``set_stream_cache`` prepares."""

    def __init__(self) -> None:
        self.cache: Any = None

    def set_stream_cache(self, prompt_wav: str) -> tuple[Any, Any]:  # the real one's signature
        raise AssertionError("the fake model prepares voices in init_token2wav_cache")


class FakeMiniCPMO:
    """The checkpoint's model class: simplex API plus ``as_duplex()``."""

    def __init__(self) -> None:
        self.tts_ready = False
        self.duplex_object: FakeDuplex | None = None
        self.prefills: list[dict[str, Any]] = []
        self.generations: list[dict[str, Any]] = []
        self.voices: list[np.ndarray] = []
        self.fail_generate_after: int | None = None
        self.fail_prefill = False
        self.answer_words = 12
        self.tts = SimpleNamespace(audio_tokenizer=FakeToken2wav())
        self.reset_session(reset_token2wav_cache=True)

    # --- set-up ------------------------------------------------------------------

    def init_tts(
        self, streaming: bool = False, model_dir: str | None = None, enable_float16: bool = False
    ) -> None:
        self.tts_ready = True

    def as_duplex(self, device: str | None = None, **kwargs: Any) -> FakeDuplex:
        if self.duplex_object is None:
            self.duplex_object = FakeDuplex(self, generate_audio=kwargs.get("generate_audio", True))
        return self.duplex_object

    # --- simplex -----------------------------------------------------------------

    def reset_session(self, reset_token2wav_cache: bool = True) -> None:
        self.llm_past_key_values: FakeCache | None = None
        self.audio_past_key_values: list[int] | None = None
        self.tts_last_turn_tokens: list[int] | None = None
        self.llm_generated = False
        self.llm_generate_completed = False
        self.new_user_msg = True
        self.session_id: str | None = None
        if reset_token2wav_cache:
            self.token2wav_cache: dict[str, Any] | None = None

    def init_token2wav_cache(self, prompt_speech_16k: np.ndarray) -> None:
        if not self.tts_ready:
            raise AttributeError("'NoneType' object has no attribute 'set_stream_cache'")
        self.voices.append(prompt_speech_16k)
        self.tts.audio_tokenizer.cache = ("prompt of", len(self.voices))
        self.token2wav_cache = {"flow_cache_base": [len(self.voices)], "hift_cache_base": [1]}

    def streaming_prefill(
        self,
        session_id: str,
        msgs: list[dict[str, Any]],
        omni_mode: bool = True,
        max_slice_nums: int | None = None,
        use_tts_template: bool = True,
        enable_thinking: bool = False,
        is_last_chunk: bool = False,
        stream_input: bool | None = None,
        **kwargs: Any,
    ) -> str:
        assert session_id is not None and len(msgs) == 1
        if self.fail_prefill:
            raise RuntimeError("prefill exploded")
        message = msgs[0]
        assert message["role"] in ("system", "user", "assistant")
        if self.session_id != session_id:
            self.reset_session(reset_token2wav_cache=False)
            self.session_id = session_id
        self.prefills.append({"session_id": session_id, "role": message["role"],
                              "content": message["content"], "is_last_chunk": is_last_chunk,
                              "stream_input": stream_input, "omni_mode": omni_mode,
                              "use_tts_template": use_tts_template})  # fmt: skip
        if self.llm_past_key_values is None:
            self.llm_past_key_values = FakeCache()
        if message["role"] == "user" and self.new_user_msg:
            self.llm_past_key_values.add("turn", 3)  # <|im_start|>user\n
            self.new_user_msg = False
        for item in message["content"]:
            self.llm_past_key_values.add(message["role"], tokens_of(item))
        if isinstance(message["content"], list) and any(
            isinstance(c, np.ndarray) for c in message["content"]
        ):
            self.audio_past_key_values = [1]
        return "prompt"

    def streaming_generate(
        self,
        session_id: str,
        generate_audio: bool = True,
        max_new_tokens: int = 256,
        do_sample: bool = True,
        use_tts_template: bool = True,
        enable_thinking: bool = False,
        **kwargs: Any,
    ) -> Any:
        self.generations.append({"session_id": session_id, "generate_audio": generate_audio,
                                 "max_new_tokens": max_new_tokens, **kwargs})  # fmt: skip
        if generate_audio and self.token2wav_cache is None:
            raise TypeError("'NoneType' object is not subscriptable")  # as the real code fails
        self.new_user_msg = True
        self.llm_generated = True
        self.audio_past_key_values = None
        assert self.llm_past_key_values is not None
        heard = self.llm_past_key_values.get_seq_length()
        words = [f"heard{heard}"] + [f"word{i}" for i in range(self.answer_words - 1)]
        words = words[:max_new_tokens]
        self.llm_past_key_values.add("assistant", 4)  # <|im_start|>assistant ... <|tts_bos|>
        for start in range(0, len(words), 4):
            if self.fail_generate_after is not None and start >= self.fail_generate_after:
                raise RuntimeError("generation exploded")
            piece = words[start : start + 4]
            self.llm_past_key_values.add("assistant", len(piece))
            text = " ".join(piece) + " "
            if generate_audio:
                self.tts_last_turn_tokens = [len(piece)]
                yield np.full(OUT_RATE // 2, 0.2, np.float32), text
            else:
                yield text, start + 4 >= len(words)
        self.llm_generate_completed = True

    # --- accounting for the tests ------------------------------------------------------

    @property
    def live(self) -> int:
        """Tokens held in caches: what a GPU would be holding for sessions."""
        total = self.llm_past_key_values.get_seq_length() if self.llm_past_key_values else 0
        duplex = self.duplex_object
        if duplex is not None:
            total += duplex.decoder.get_cache_length() + sum(duplex.total_hidden)
            total += len(duplex.tts_past_key_values or [])
        return total


class FakeUnifiedMiniCPMO(FakeMiniCPMO):
    """The demo's unified class: ``init_unified()`` loads the vocoder and attaches
    ``model.duplex``; ``set_mode()`` switches views. No ``as_duplex``."""

    as_duplex = None  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.duplex: FakeDuplex | None = None
        self._current_mode: ProcessorMode | None = None
        self.mode_switches: list[ProcessorMode] = []

    def __getattribute__(self, name: str) -> Any:
        if name in ("as_duplex", "init_tts"):
            raise AttributeError(name)  # the unified class has neither
        return super().__getattribute__(name)

    def init_unified(
        self, pt_path: str | None = None, duplex_config: dict | None = None, device: str = "cuda"
    ) -> None:
        self.tts_ready = True
        config = duplex_config or {}
        self.duplex = self.duplex_object = FakeDuplex(self, config.get("generate_audio", True))
        self.set_mode(ProcessorMode.STREAMING)

    @property
    def current_mode(self) -> ProcessorMode | None:
        return self._current_mode

    def set_mode(self, mode: ProcessorMode) -> None:
        if mode == self._current_mode:
            return
        self.mode_switches.append(mode)
        self.reset_session(reset_token2wav_cache=True)
        if mode is ProcessorMode.DUPLEX and self.duplex is not None:
            self.duplex._reset_streaming_state()
            self.duplex.decoder.reset()
        self._current_mode = mode


class LegacyDuplex(FakeDuplex):
    """Older duplex code: no per-unit force-listen argument, no deferred finalize
    (the unit closes inside ``streaming_generate``); a break event forces listening."""

    finalize_unit = None  # type: ignore[assignment]

    def __getattribute__(self, name: str) -> Any:
        if name == "finalize_unit":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def streaming_generate(  # type: ignore[override]
        self,
        prompt_wav_path: str | None = None,
        max_new_speak_tokens_per_chunk: int = 20,
        decode_mode: str = "sampling",
        temperature: float = 0.7,
        top_k: int = 20,
        top_p: float = 0.8,
    ) -> dict[str, Any]:
        result = super().streaming_generate(
            max_new_speak_tokens_per_chunk=max_new_speak_tokens_per_chunk
        )
        self._pending_finalize = None
        return result


class LegacyMiniCPMO(FakeMiniCPMO):
    def as_duplex(self, device: str | None = None, **kwargs: Any) -> FakeDuplex:
        if self.duplex_object is None:
            self.duplex_object = LegacyDuplex(self, kwargs.get("generate_audio", True))
        return self.duplex_object
