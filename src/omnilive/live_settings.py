"""The Live API's settings (``[live]``): the judge of when a session hands
work to its backend, the backend omnilive runs itself for ``responses``
delegations, and what the model says meanwhile (docs/modes/live.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omnilive.engine_settings import Section


class ServerSettings(Section):
    """An OpenAI-compatible chat-completions server (vLLM, llama.cpp's,
    Ollama, a hosted API)."""

    url: str | None = Field(
        None, description="Base URL, e.g. http://127.0.0.1:8000/v1 (none: not configured)."
    )
    model: str = Field("", description="Model to ask for (empty: the session's, else the first).")
    api_key_env: str | None = Field(None, description="Environment variable holding its key.")
    timeout_s: float = Field(60.0, gt=0, description="Longest wait for one answer.")
    n_ctx: int = Field(8192, gt=0, description="Its context, for fitting the conversation.")
    temperature: float | None = Field(
        0.0, ge=0, le=2, description="Sampling temperature asked for (0: repeatable answers)."
    )
    stream_auto_tools: bool = Field(
        True,
        description="Stream answers whose tool choice is auto (false for servers that cannot, "
        "as llama-cpp-python's chatml-function-calling: they are asked for the answer whole).",
    )


class JudgeSettings(Section):
    """Whether a user's turn needs the backend: read from its transcript
    against the session's instructions and tools."""

    mode: Literal["cues", "model", "off"] = Field(
        "cues",
        description="cues: the turn shares a content word with a tool or a delegation line of "
        "the instructions; model: a text model (judge.server) answers yes or no; off: never.",
    )
    server: ServerSettings = Field(default_factory=ServerSettings)
    max_tokens: int = Field(3, ge=1, le=64, description="The model judge's answer length.")


class LiveSettings(Section):
    """OpenAI's Live API (``/v1/live/sessions``)."""

    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    backend: ServerSettings = Field(
        default_factory=ServerSettings,
        description="The Responses backend of responses delegations (its model: the "
        "session's delegation.responses.model unless model is set here).",
    )
    acknowledgement: str = Field(
        "One moment, let me check.",
        min_length=1,
        description="Said on a delegation when no commentary or thinking came within the "
        "session's acknowledgement_delay_ms.",
    )
    usage_every_s: float = Field(5.0, gt=0, description="How often session.usage.updated comes.")
    max_pending_appends: int = Field(
        32, ge=1, description="Appends waiting for the next unit; more are refused."
    )
