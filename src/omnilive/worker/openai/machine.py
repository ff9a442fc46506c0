"""The rules of a Realtime conversation on the worker (the OpenAI dialect's
session), without I/O: its phases, its turn detection as a VAD
configuration, and what a session's (or one response's) settings ask of
the engine."""

from __future__ import annotations

import dataclasses
import math

from omnilive.engines.base import CapabilityError, EngineError
from omnilive.engines.messages import (
    GenerationOptions,
    HalfDuplexOptions,
    HistoryTruncation,
    Tools,
)
from omnilive.engines.truncation import ContextFullError
from omnilive.protocol.openai_realtime import (
    ResponseParams,
    SemanticVad,
    SessionConfig,
    Truncation,
)
from omnilive.vad import VadConfig
from omnilive.worker.machines.half_duplex import HALF_DUPLEX_PHASES, HalfDuplexPhase
from omnilive.worker.machines.session import SessionMachine

DEFAULT_INSTRUCTIONS = "You are a helpful assistant. Reply briefly and naturally."
# semantic_vad's eagerness as silence (no end-of-turn model yet).
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 800, "high": 400, "auto": 800}
UNBOUNDED_TOKENS = 4096  # max_output_tokens "inf"


class ConversationMachine(SessionMachine[HalfDuplexPhase]):
    """The session's phases (prepared at once: the gateway configured it).
    A client that sends no event at all within ``first_message_s`` of being
    served ends ``idle``, as on the other routes: it would hold its slot for
    the session's whole life. Once it has spoken, only the gateway's time
    limit bounds the session."""

    phases = HALF_DUPLEX_PHASES  # the half-duplex view's session
    heard_from_client = False

    def client_event(self) -> None:
        self.heard_from_client = True

    def deadline(self) -> tuple[float, str]:
        if self.unprepared or not self.heard_from_client:
            return super().deadline()
        return math.inf, "timeout"


def vad_config(config: SessionConfig) -> VadConfig | None:
    """The server VAD that turn detection asks for (None: the client commits)."""
    detection = config.audio.input.turn_detection
    if detection is None:
        return None
    if isinstance(detection, SemanticVad):
        silence_ms = SEMANTIC_SILENCE_MS[detection.eagerness]
        return VadConfig(threshold=0.5, min_silence_duration_ms=silence_ms)
    return VadConfig(
        threshold=min(max(detection.threshold, 0.2), 0.99),
        min_silence_duration_ms=max(detection.silence_duration_ms, 100),
        speech_pad_ms=min(detection.prefix_padding_ms, 1000),
    )


def instructions(config: SessionConfig) -> str:
    return config.instructions or DEFAULT_INSTRUCTIONS


def options(config: SessionConfig, params: ResponseParams | None = None) -> HalfDuplexOptions:
    """Generation options for the session, or for one response's overrides."""
    modalities = (params and params.output_modalities) or config.output_modalities
    limit = (params and params.max_output_tokens) or config.max_output_tokens
    tokens = UNBOUNDED_TOKENS if limit == "inf" else int(limit)
    generation = GenerationOptions(max_new_tokens=tokens, length_penalty=1.1)
    own = params.temperature if params is not None else None
    temperature = own if own is not None else config.temperature
    if temperature is not None:
        generation = dataclasses.replace(
            generation, temperature=temperature, do_sample=temperature > 0
        )
    return HalfDuplexOptions(
        generation=generation,
        tts_enabled="audio" in modalities,
        truncation=truncation(config.truncation),
    )


def truncation(asked: Truncation) -> HistoryTruncation:
    """The engine's rule for a session's ``truncation``."""
    if asked == "auto":
        return HistoryTruncation()
    if asked == "disabled":
        return HistoryTruncation(enabled=False)
    limits = asked.token_limits
    limit = limits.post_instructions if limits is not None else None
    return HistoryTruncation(limit_tokens=limit, retention_ratio=asked.retention_ratio)


def tools(config: SessionConfig, params: ResponseParams | None = None) -> Tools:
    """The functions offered (a response's own replace the session's)."""
    declared = params.tools if params and params.tools is not None else config.tools
    choice = (params and params.tool_choice) or config.tool_choice
    name = choice if isinstance(choice, str) else f"function:{choice.name}"
    return Tools(tuple(t.model_dump(exclude_none=True) for t in declared), name)


def overrides(params: ResponseParams) -> tuple[bool, bool]:
    """Whether a response changes the session's (tools, options) for itself."""
    changes_tools = params.tools is not None or params.tool_choice is not None
    changes_options = params.output_modalities or params.max_output_tokens
    return changes_tools, bool(changes_options) or params.temperature is not None


def engine_error_code(exc: EngineError) -> str:
    """The ``error.code`` of an engine's failure: a capability it lacks, a
    conversation with no room that may not truncate, or any other."""
    if isinstance(exc, CapabilityError):
        return "unsupported"
    if isinstance(exc, ContextFullError):
        return "context_length_exceeded"
    return "inference_error"
