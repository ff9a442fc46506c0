"""The OpenAI Realtime API (GA) dialect of ``/v1/realtime``: its client
events, typed at the boundary, and its ``error`` event.

The shapes follow the ``openai`` package's realtime types (GA, 2025-08):
``session.update`` carries ``session{type: "realtime", instructions,
output_modalities, audio{input{format, transcription, turn_detection},
output{format, voice}}, tools, tool_choice, max_output_tokens}``. Unknown
fields are ignored, as OpenAI's own server does with fields it does not
know of a newer SDK; a field of a known name with a bad value is an
``invalid_request_error`` naming it (``param``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from omnilive.ids import mint
from omnilive.protocol.common import Base64Str, ProtocolError

_MODEL = ConfigDict(extra="ignore", frozen=True)
DIALECT = "openai"
DEFAULT_MODEL = "omnilive-realtime"
DUPLEX_SUFFIX = "-duplex"  # a model named so is served on the full-duplex loop
INPUT_RATE_HZ = 24_000  # audio/pcm in the GA API is 24 kHz 16-bit mono


# --- session configuration -------------------------------------------------------


class AudioFormat(BaseModel):
    model_config = _MODEL
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: Literal[24000] | None = None


class ServerVad(BaseModel):
    model_config = _MODEL
    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


class SemanticVad(BaseModel):
    model_config = _MODEL
    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


TurnDetection = Annotated[ServerVad | SemanticVad, Field(discriminator="type")]


class Transcription(BaseModel):
    model_config = _MODEL
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInput(BaseModel):
    model_config = _MODEL
    format: AudioFormat = Field(default_factory=AudioFormat)
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = Field(
        default_factory=lambda: ServerVad(type="server_vad")
    )


class AudioOutput(BaseModel):
    model_config = _MODEL
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str | None = None
    speed: float = Field(1.0, ge=0.25, le=1.5)


class AudioConfig(BaseModel):
    model_config = _MODEL
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class FunctionTool(BaseModel):
    model_config = _MODEL
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class FunctionChoice(BaseModel):
    model_config = _MODEL
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | FunctionChoice
Modality = Literal["text", "audio"]
# OpenAI's bounds: one or both modalities; an answer of 1 to 4096 tokens, or "inf".
Modalities = Annotated[list[Modality], Field(min_length=1, max_length=2)]
MaxOutputTokens = Annotated[int, Field(ge=1, le=4096)] | Literal["inf"]


class TokenLimits(BaseModel):
    model_config = _MODEL
    post_instructions: int | None = Field(None, ge=1)


class RetentionRatio(BaseModel):
    """Truncation that lets the history go down to ``retention_ratio`` of its
    limit (``token_limits.post_instructions``, else the context's) once past it."""

    model_config = _MODEL
    type: Literal["retention_ratio"]
    retention_ratio: float = Field(ge=0.0, le=1.0)
    token_limits: TokenLimits | None = None


# When the conversation outgrows the context: "auto", the oldest turns leave as
# the engine needs; "disabled", none do and the answer fails instead.
Truncation = Literal["auto", "disabled"] | RetentionRatio


class SessionConfig(BaseModel):
    """The session as the client configures it; the fields a ``session.update``
    names replace the session's, the others stay."""

    model_config = _MODEL
    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str | None = None
    output_modalities: Modalities = Field(default_factory=lambda: list[Modality](["audio"]))
    audio: AudioConfig = Field(default_factory=AudioConfig)
    tools: list[FunctionTool] = Field(default_factory=list, max_length=128)
    tool_choice: ToolChoice = "auto"
    max_output_tokens: MaxOutputTokens = "inf"
    # The beta API's sampling temperature, which clients written for it still
    # send; omnilive honours it (0: greedy, the same answer every time).
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    truncation: Truncation = "auto"

    def updated(self, change: SessionConfig) -> SessionConfig:
        """This session with the fields ``change`` was given replaced; the
        audio section merges one level down (input, output)."""
        fields = {name: getattr(change, name) for name in change.model_fields_set}
        if "audio" in fields:
            audio = change.audio
            fields["audio"] = self.audio.model_copy(
                update={n: getattr(audio, n) for n in audio.model_fields_set}
            )
        return self.model_copy(update=fields)


# --- conversation items -------------------------------------------------------------


class ContentPart(BaseModel):
    model_config = _MODEL
    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: Base64Str | None = None
    transcript: str | None = None


class MessageItem(BaseModel):
    model_config = _MODEL
    type: Literal["message"]
    id: str | None = Field(None, max_length=64)
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(max_length=64)


class FunctionCallItem(BaseModel):
    model_config = _MODEL
    type: Literal["function_call"]
    id: str | None = Field(None, max_length=64)
    call_id: str = Field(max_length=64)
    name: str
    arguments: str = ""


class FunctionCallOutputItem(BaseModel):
    model_config = _MODEL
    type: Literal["function_call_output"]
    id: str | None = Field(None, max_length=64)
    call_id: str = Field(max_length=64)
    output: str


Item = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")
]


class ItemReference(BaseModel):
    """An item of the conversation, named in a response's own ``input``."""

    model_config = _MODEL
    type: Literal["item_reference"]
    id: str


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ItemReference,
    Field(discriminator="type"),
]


class ResponseParams(BaseModel):
    """``response.create``'s ``response``: what this one response does differently."""

    model_config = _MODEL
    instructions: str | None = None
    output_modalities: Modalities | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxOutputTokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # as the session's
    conversation: Literal["auto", "none"] = "auto"
    input: list[InputItem] | None = Field(None, max_length=4096)
    metadata: dict[str, Any] | None = None


# --- client events ------------------------------------------------------------------------


class _Event(BaseModel):
    model_config = _MODEL
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionConfig


class AudioAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: Base64Str


class AudioCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: Item


class ItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseParams = Field(default_factory=ResponseParams)


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioClear(_Event):
    type: Literal["output_audio_buffer.clear"]


ClientEvent = Annotated[
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemRetrieve
    | ItemDelete
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear,
    Field(discriminator="type"),
]
client_event = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.delete",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)


ERROR_CODES = frozenset(
    {
        # a bad event (gateway): the session goes on
        "invalid_json", "missing_required_parameter", "invalid_value", "payload_too_large",
        "too_many_events",
        # an event the session cannot follow (worker): the session goes on
        "item_not_found", "item_already_exists", "conversation_full", "unsupported",
        "input_audio_buffer_commit_empty", "conversation_already_has_active_response",
        "response_cancel_not_active", "inference_error", "context_length_exceeded",
        # the session ends
        "session_expired", "server_shutdown", "context_full", "server_error", "app_disabled",
    }
)  # fmt: skip
"""Every ``error.code`` omnilive sends in this dialect (docs/reference/openai-realtime.md)."""


def parse_client_event(data: dict[str, Any]) -> ClientEvent:
    """A decoded JSON object as a typed client event, or :class:`ProtocolError`."""
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("missing_required_parameter", "an event needs a type", "type", event_id)
    if kind not in CLIENT_EVENT_TYPES:
        raise ProtocolError("invalid_value", f"unknown event type {kind[:64]!r}", "type", event_id)
    try:
        return client_event.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"][1:]) or None
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
        raise ProtocolError(code, f"{param or kind}: {first['msg']}", param, event_id) from None


# Where pydantic's error locations name a union's member, not a field.
_UNION_TAGS = frozenset(
    {"message", "function_call", "function_call_output", "item_reference", "server_vad",
     "semantic_vad", "FunctionChoice", "constrained-int", "int"}
)  # fmt: skip


def _param(loc: tuple[Any, ...]) -> str:
    """The field an error names, as OpenAI's ``param`` says it (``item.role``)."""
    names = [str(p) for p in loc if p not in _UNION_TAGS and not str(p).startswith("literal[")]
    return ".".join(names)


# --- server events -----------------------------------------------------------------------


def event_id() -> str:
    return mint("event_", 8)


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event: its ``type`` and a fresh ``event_id``, then ``fields``
    as they are now. Events are serialised later (a session's outbox), while
    the objects they show (an item, a response) go on changing: an
    ``.added`` event must show its item as it was when added."""
    return {"type": kind, "event_id": event_id(), **copy.deepcopy(fields)}


def error_event(
    code: str,
    message: str,
    param: str | None = None,
    client_event_id: str | None = None,
    kind: str = "invalid_request_error",
) -> dict[str, Any]:
    """OpenAI's error event: ``error{type, code, message, param, event_id}``,
    ``event_id`` naming the client event that caused it."""
    error = {
        "type": kind,
        "code": code,
        "message": message,
        "param": param,
        "event_id": client_event_id,
    }
    return server_event("error", error=error)


def refusal_event(
    refused: ProtocolError[str], kind: str = "invalid_request_error"
) -> dict[str, Any]:
    """This dialect's presenter of a refusal: its ``error`` event."""
    return error_event(str(refused.code), refused.message, refused.param, refused.event_id, kind)


def session_object(session_id: str, config: SessionConfig, model: str) -> dict[str, Any]:
    """The session as ``session.created`` / ``session.updated`` show it."""
    # Fields not set are left out, not null, where OpenAI's schema has no
    # null (instructions, transcription.language / .prompt): a strict client
    # (TypeScript's types, the OpenAPI spec) refuses a null there. The beta
    # API's temperature shows only once set: the session looks as OpenAI's GA one.
    body = _without_nulls(config.model_dump(mode="json"))
    turn_detection = config.audio.input.turn_detection
    body["audio"]["input"]["turn_detection"] = (  # off is null: the schema has it
        None if turn_detection is None else body["audio"]["input"]["turn_detection"]
    )
    for direction in ("input", "output"):
        fmt = body["audio"][direction]["format"]
        if fmt["type"] == "audio/pcm":
            fmt["rate"] = INPUT_RATE_HZ
        else:
            fmt.pop("rate", None)
    body["audio"]["output"].setdefault("voice", "default")
    return {
        **body,
        "id": session_id,
        "object": "realtime.session",
        "model": model,
        "expires_at": 0,
        "tracing": None,
        "prompt": None,
    }


def _without_nulls(value: Any) -> Any:
    """``value`` with every ``None`` left out of its objects (nulls in lists stay)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


# --- omnilive's own information, for clients that ask for it ----------------------------------

EXTENSIONS_PARAM = "omnilive_extensions"
"""``/v1/realtime?model=…&omnilive_extensions=true``: besides OpenAI's own
events, omnilive's (``omnilive.queue.*``, ``omnilive.session.*``) and the
resume token (``docs/resume.md``). Without it a session speaks only the
events of OpenAI's server-event union: the Python Agents SDK turns any other
into an error, and no OpenAI client knows a resume token."""

OMNILIVE_QUEUE_EVENTS = {
    "queued": "omnilive.queue.waiting",
    "queue_update": "omnilive.queue.waiting",
    "queue_done": "omnilive.queue.done",
}
"""omnilive's own queue events, with ``omnilive_extensions``."""


def wants_extensions(query: Mapping[str, str]) -> bool:
    return query.get(EXTENSIONS_PARAM, "").lower() in ("1", "true", "yes")


def queue_rate_limits(message: dict[str, Any]) -> dict[str, Any]:
    """A pool message as OpenAI's own shape for "wait before it runs":
    ``rate_limits.updated`` with the session's one ``requests`` place,
    ``remaining`` 0 while it waits (``reset_seconds``: the estimated wait),
    1 once a worker took it."""
    waiting = message["type"] != "queue_done"
    limit = {
        "name": "requests",
        "limit": 1,
        "remaining": 0 if waiting else 1,
        "reset_seconds": float(message.get("estimated_wait_s", 0.0)) if waiting else 0.0,
    }
    return server_event("rate_limits.updated", rate_limits=[limit])
