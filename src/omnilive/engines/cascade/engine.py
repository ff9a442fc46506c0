"""The cascade engine: loads the models once and opens sessions of each view."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from omnilive.audio import INPUT_RATE, OUTPUT_RATE, resample
from omnilive.end_of_turn import finished_judge
from omnilive.engine_settings import CascadeSettings
from omnilive.engines.base import (
    Capabilities,
    Engine,
    EngineError,
    EngineUnavailable,
    ProgressCallback,
)
from omnilive.engines.cascade.asr import WhisperASR
from omnilive.engines.cascade.chat import CascadeChat
from omnilive.engines.cascade.duplex import CascadeDuplex
from omnilive.engines.cascade.half_duplex import CascadeHalfDuplex
from omnilive.engines.cascade.llm import N_CTX, LlamaChat, Message, set_process_knobs
from omnilive.engines.cascade.models import prepare_models
from omnilive.engines.cascade.piper import PiperVoice, packaged_voice
from omnilive.engines.cascade.remote_llm import RemoteChat
from omnilive.engines.cascade.stack import ModelStack, log
from omnilive.engines.cascade.tts import EspeakTTS, Speech
from omnilive.engines.cascade.utterance import TurnJudging
from omnilive.engines.messages import GenerationOptions, Modality, Voice
from omnilive.session_settings import EndOfTurnSettings

if TYPE_CHECKING:
    from omnilive.config import Settings

WARMUP_PHRASE = "Hello."


class CascadeEngine(Engine):
    """Silero VAD + Whisper base + SmolLM2-135M + espeak-ng, offline on the CPU.

    Hears text and audio, speaks with espeak-ng voices; it cannot see and
    cannot clone a voice. One session at a time (the CPU is the bottleneck).
    """

    name = "cascade"

    def __init__(
        self,
        settings: CascadeSettings,
        data_dir: Path,
        end_of_turn: EndOfTurnSettings | None = None,
    ) -> None:
        self._settings = settings
        self._end_of_turn = end_of_turn
        self._data_dir = Path(data_dir)
        self._stack: ModelStack | None = None
        self.load_timings: dict[str, float] = {}
        self.capabilities = Capabilities(
            input_modalities=frozenset({Modality.TEXT, Modality.AUDIO}),
            audio_output=True,
            voice_cloning=False,
            context_length=N_CTX,
            slots=1,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> CascadeEngine:
        """The engine of ``settings.cascade`` (the registry's factory)."""
        return cls(settings.cascade, settings.data_dir, settings.end_of_turn)

    def load(self, progress: ProgressCallback) -> None:
        set_process_knobs()
        started = time.perf_counter()
        files = prepare_models(self._data_dir, progress)
        joined = time.perf_counter()
        stack = ModelStack(
            asr=WhisperASR(files.whisper_dir, self._settings.asr_threads),
            llm=self._language_model(files.llm_gguf),
            tts=Speech(EspeakTTS(self._settings.voice), self._piper()),
            turn_judging=self._turn_judging(),
            history_messages=self._settings.llm.history_messages,
        )
        # Each stage reports its own fraction, like the join before it.
        progress("load models", 0.0)
        stack.tts.load()
        progress("load models", 0.1)
        stack.asr.load()
        progress("load models", 0.6)
        stack.llm.load()
        progress("load models", 1.0)
        loaded = time.perf_counter()
        progress("warm up", 0.0)
        self._warm_up(stack)
        done = time.perf_counter()
        self._stack = stack
        progress("ready", 1.0)
        self.load_timings = {
            "files_s": joined - started,
            "models_s": loaded - joined,
            "warmup_s": done - loaded,
            "total_s": done - started,
        }
        rounded = {k: round(v, 3) for k, v in self.load_timings.items()}
        log.info("cascade engine loaded: %s", rounded)

    def _language_model(self, packaged: Path) -> LlamaChat | RemoteChat:
        """SmolLM2 as packaged, unless ``cascade.llm`` names a server or a GGUF file."""
        settings = self._settings.llm
        if settings.url:
            return RemoteChat.from_settings(settings)
        if settings.gguf is not None:
            if not settings.gguf.is_file():
                raise EngineUnavailable(f"cascade.llm.gguf: {settings.gguf} is not a file")
            return LlamaChat(settings.gguf, self._settings.threads, settings.n_ctx)
        return LlamaChat(packaged, self._settings.threads, N_CTX)

    def _turn_judging(self) -> TurnJudging | None:
        """The end-of-turn model for the duplex loop (half-duplex sessions
        use the worker's, on every engine); without it, silence decides."""
        settings = self._end_of_turn
        if settings is None:
            return None
        finished = finished_judge(settings, "duplex turns end by silence alone")
        if finished is None:
            return None
        return TurnJudging(finished, settings.check_after_ms, settings.confirmations)

    def _piper(self) -> PiperVoice | None:
        if self._settings.tts != "piper":
            return None
        path = self._settings.piper_voice or packaged_voice()
        return PiperVoice(path, threads=self._settings.threads)

    def _warm_up(self, stack: ModelStack) -> None:
        """One pass through every model, so the first real request pays no first-call costs."""
        speech = stack.tts.synthesize(WARMUP_PHRASE, stack.tts.default_voice)
        stack.asr.transcribe(resample(speech, OUTPUT_RATE, INPUT_RATE))
        prompt = stack.llm.tokens([Message("system", "Say hello."), Message("user", WARMUP_PHRASE)])
        for _ in stack.llm.stream(prompt, GenerationOptions(temperature=0.0), max_tokens=2):
            pass

    def _loaded(self) -> ModelStack:
        if self._stack is None:
            raise EngineError("the cascade engine is not loaded")
        return self._stack

    @property
    def stack(self) -> ModelStack:
        """The loaded models (tests and benchmarks time them one by one)."""
        return self._loaded()

    def open_chat(self) -> CascadeChat:
        return CascadeChat(self._loaded(), self.require)

    def open_half_duplex(self) -> CascadeHalfDuplex:
        return CascadeHalfDuplex(self._loaded(), self.require, self._settings.early_answer)

    def open_duplex(self) -> CascadeDuplex:
        return CascadeDuplex(self._loaded())

    def default_voice(self) -> Voice | None:
        stack = self._stack
        return Voice(name=stack.tts.default_voice if stack is not None else self._settings.voice)

    def close(self) -> None:
        if self._stack is not None:
            self._stack.llm.close()
            self._stack.tts.close()
            self._stack = None
