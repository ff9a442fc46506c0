"""OpenAI's Live API (``/v1/live/sessions``, ``gpt-live-1``): its client
events, typed at the boundary, and what omnilive refuses of them.

The shapes follow the ``openai`` package's ``openai/types/live/`` (3.5x):
``session.start{session{model, audio{format, output{voice}}, delegation,
input, instructions, ...}}`` first, then audio appends, the appends that
write into the model's context (``instructions``, ``thinking``,
``commentary``), ``session.update`` (delegation settings), the Responses
backend's ``response.item.create`` / ``response.create``, and
``session.close``. Unknown fields are ignored, as the GA dialect does; a
known field with a bad value is an ``invalid_value`` naming it (``param``).

What omnilive cannot serve is refused by name, never dropped: Decisions
(``decision.*``, ``delegation.type = decisions``, ``triggers``), audio
fixtures, hosted tools of the Responses backend (web search, MCP, ...),
``store`` and a WebRTC frontend's ``client`` permissions
(:data:`UNSUPPORTED_EVENTS`, :func:`refusal`). The server events are
:mod:`omnilive.protocol.openai_live_events`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from omnilive.protocol.common import Base64Str, ProtocolError

_MODEL = ConfigDict(extra="ignore", frozen=True)
DIALECT = "live"
DEFAULT_VOICE = "marin"  # OpenAI's default; every built-in name is the engine's own voice
MAX_APPEND_TOKENS = 500  # OpenAI's limit for one append
CHARS_PER_TOKEN = 4  # an append's tokens, counted without the model's tokenizer
MAX_INPUT_ITEMS = 128
ACK_DELAY_DEFAULT_MS = 0  # OpenAI's default outside Decisions sessions


# --- session configuration -------------------------------------------------------


class PcmFormat(BaseModel):
    model_config = _MODEL
    type: Literal["audio/pcm"]
    rate: Literal[16000, 24000] = 24000


class G711Format(BaseModel):
    model_config = _MODEL
    type: Literal["audio/pcmu", "audio/pcma"]
    rate: Literal[8000] = 8000


AudioFormat = Annotated[PcmFormat | G711Format, Field(discriminator="type")]


class CustomVoice(BaseModel):
    """A voice of omnilive's voice store (``POST /api/assets/ref_audio``), by id."""

    model_config = _MODEL
    id: str = Field(min_length=1, max_length=128)


class AudioOutput(BaseModel):
    model_config = _MODEL
    voice: str | CustomVoice = DEFAULT_VOICE


class Audio(BaseModel):
    model_config = _MODEL
    format: AudioFormat = Field(default_factory=lambda: PcmFormat(type="audio/pcm"))
    output: AudioOutput = Field(default_factory=AudioOutput)


class FunctionTool(BaseModel):
    model_config = _MODEL
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(BaseModel):
    model_config = _MODEL
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | FunctionChoice


class ResponsesConfig(BaseModel):
    """The Responses backend omnilive runs itself (``delegation.responses``):
    any OpenAI-compatible chat-completions server (``live.backend``), with
    this model, prompt and function tools. ``tools`` are kept as sent and
    checked by :func:`refusal`: only function tools can be served."""

    model_config = _MODEL
    model: str = Field(min_length=1, max_length=256)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=32_768)
    parallel_tool_calls: bool | None = None
    tool_choice: ToolChoice | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)

    def functions(self) -> list[FunctionTool]:
        return [FunctionTool.model_validate(t) for t in self.tools or []]


class ResponsesUpdate(BaseModel):
    """``session.update``'s changes to the backend: omitted fields stay."""

    model_config = _MODEL
    model: str | None = Field(None, min_length=1, max_length=256)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=32_768)
    parallel_tool_calls: bool | None = None
    tool_choice: ToolChoice | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)


class ClientDelegation(BaseModel):
    model_config = _MODEL
    type: Literal["client"]
    acknowledgement_delay_ms: int | None = Field(None, ge=0, le=60_000)


class ResponsesDelegation(BaseModel):
    model_config = _MODEL
    type: Literal["responses"]
    responses: ResponsesConfig
    acknowledgement_delay_ms: int | None = Field(None, ge=0, le=60_000)


class ResponsesDelegationUpdate(BaseModel):
    model_config = _MODEL
    type: Literal["responses"]
    responses: ResponsesUpdate | None = None
    acknowledgement_delay_ms: int | None = Field(None, ge=0, le=60_000)


class DecisionsDelegation(BaseModel):
    """Kept only to be refused by name (:func:`refusal`)."""

    model_config = _MODEL
    type: Literal["decisions"]
    decisions: dict[str, Any] | None = None
    acknowledgement_delay_ms: int | None = None


Delegation = Annotated[
    ClientDelegation | ResponsesDelegation | DecisionsDelegation, Field(discriminator="type")
]
DelegationUpdate = Annotated[
    ClientDelegation | ResponsesDelegationUpdate | DecisionsDelegation,
    Field(discriminator="type"),
]


class TextPart(BaseModel):
    model_config = _MODEL
    text: str
    type: Literal["input_text", "text", "output_text"] | None = None


class InitialItem(BaseModel):
    """One message of the text history a session starts with."""

    model_config = _MODEL
    role: Literal["developer", "user", "assistant"]
    content: list[TextPart] = Field(min_length=1, max_length=1)
    id: str | None = None
    type: Literal["message"] | None = None

    @property
    def text(self) -> str:
        return self.content[0].text


class SessionConfig(BaseModel):
    """``session.start``'s ``session``: fixed at start but for the delegation."""

    model_config = _MODEL
    model: str = Field(min_length=1, max_length=128)
    audio: Audio = Field(default_factory=Audio)
    delegation: Delegation | None = None
    input: list[InitialItem] | None = Field(None, max_length=MAX_INPUT_ITEMS)
    instructions: str | None = Field(None, max_length=65_536)
    safety_identifier: str | None = Field(None, max_length=256)
    store: bool | None = None
    triggers: list[dict[str, Any]] | None = None
    client: dict[str, Any] | None = None

    @property
    def owner(self) -> Literal["client", "responses"]:
        """Who answers delegations (null: the application)."""
        return "responses" if isinstance(self.delegation, ResponsesDelegation) else "client"

    @property
    def acknowledgement_delay_ms(self) -> int:
        delay = self.delegation.acknowledgement_delay_ms if self.delegation else None
        return ACK_DELAY_DEFAULT_MS if delay is None else delay

    def updated(self, change: SessionUpdateConfig) -> SessionConfig:
        """The session after an update :func:`update_refusal` accepted."""
        new = change.delegation
        if new is None:
            return self
        old = self.delegation
        if isinstance(new, ResponsesDelegationUpdate) and isinstance(old, ResponsesDelegation):
            responses = old.responses
            if new.responses is not None:
                fields = {n: getattr(new.responses, n) for n in new.responses.model_fields_set}
                responses = responses.model_copy(update=fields)
            delay = new.acknowledgement_delay_ms
            delegation: Any = old.model_copy(
                update={
                    "responses": responses,
                    "acknowledgement_delay_ms": old.acknowledgement_delay_ms
                    if delay is None
                    else delay,
                }
            )
        elif isinstance(new, ClientDelegation):
            delay = new.acknowledgement_delay_ms
            keep = old.acknowledgement_delay_ms if isinstance(old, ClientDelegation) else None
            delegation = new.model_copy(
                update={"acknowledgement_delay_ms": keep if delay is None else delay}
            )
        else:
            return self
        return self.model_copy(update={"delegation": delegation})


class SessionUpdateConfig(BaseModel):
    model_config = _MODEL
    delegation: DelegationUpdate | None = None
    triggers: list[dict[str, Any]] | None = None


# --- client events ------------------------------------------------------------------------


class _Event(BaseModel):
    model_config = _MODEL
    event_id: str | None = Field(None, max_length=256)


class SessionStart(_Event):
    type: Literal["session.start"]
    session: SessionConfig


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionUpdateConfig


class AudioAppend(_Event):
    type: Literal["session.input_audio.append"]
    audio: Base64Str


class AudioMute(_Event):
    type: Literal["session.input_audio.mute"]


class AudioUnmute(_Event):
    type: Literal["session.input_audio.unmute"]


class _Append(_Event):
    content: str = Field(min_length=1)
    delegation_id: str | None = Field(None, max_length=128)


class InstructionsAppend(_Append):
    type: Literal["session.instructions.append"]


class ThinkingAppend(_Append):
    type: Literal["session.thinking.append"]


class CommentaryAppend(_Append):
    type: Literal["session.commentary.append"]


class ResponseItemCreate(_Event):
    """An input item for the Responses backend; ``function_call_output``
    items answer the backend's calls, ``message`` items add to its input."""

    type: Literal["response.item.create"]
    item: dict[str, Any]


class ResponseCreate(_Event):
    type: Literal["response.create"]


class SessionClose(_Event):
    type: Literal["session.close"]


Append = InstructionsAppend | ThinkingAppend | CommentaryAppend
ClientEvent = Annotated[
    SessionStart
    | SessionUpdate
    | AudioAppend
    | AudioMute
    | AudioUnmute
    | InstructionsAppend
    | ThinkingAppend
    | CommentaryAppend
    | ResponseItemCreate
    | ResponseCreate
    | SessionClose,
    Field(discriminator="type"),
]
client_event = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES = frozenset(
    {
        "session.start",
        "session.update",
        "session.input_audio.append",
        "session.input_audio.mute",
        "session.input_audio.unmute",
        "session.instructions.append",
        "session.thinking.append",
        "session.commentary.append",
        "response.item.create",
        "response.create",
        "session.close",
    }
)
UNSUPPORTED_EVENTS = {
    "decision.create": "Decisions are not served by omnilive",
    "decision.item.create": "Decisions are not served by omnilive",
    "decision.item.delete": "Decisions are not served by omnilive",
    "session.output_audio.fixture.play": "audio fixtures are not served by omnilive",
}
"""Events of OpenAI's client union that omnilive refuses (``unsupported``)."""

ERROR_CODES = frozenset(
    {
        # a bad event: the session goes on
        "invalid_json", "missing_required_parameter", "invalid_value", "payload_too_large",
        "too_many_events", "unsupported", "session_not_started", "session_already_started",
        "content_too_long", "delegation_not_found", "responses_delegation_required",
        "immutable_parameter",
        # what the session's worker could not do: the session goes on
        "backend_error", "inference_error",
        # the session ends (session.closed follows)
        "session_expired", "server_shutdown", "server_error", "app_disabled", "queue_full",
        "service_unavailable", "worker_busy", "worker_connect_failed",
    }
)  # fmt: skip
"""Every ``error.code`` omnilive sends in this dialect (docs/reference/openai-live.md)."""


def parse_client_event(data: dict[str, Any]) -> ClientEvent:
    """A decoded JSON object as a typed client event, or :class:`ProtocolError`."""
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("missing_required_parameter", "an event needs a type", "type", event_id)
    if kind in UNSUPPORTED_EVENTS:
        raise ProtocolError("unsupported", UNSUPPORTED_EVENTS[kind], "type", event_id)
    if kind not in CLIENT_EVENT_TYPES:
        raise ProtocolError("invalid_value", f"unknown event type {kind[:64]!r}", "type", event_id)
    try:
        event: ClientEvent = client_event.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"]) or None
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
        raise ProtocolError(code, f"{param or kind}: {first['msg']}", param, event_id) from None
    return event


# Where pydantic's error locations name a union's member, not a field.
_UNION_TAGS = frozenset(
    {"client", "responses", "decisions", "audio/pcm", "audio/pcmu", "audio/pcma", "str",
     "CustomVoice", "FunctionChoice", "session.start", "session.update",
     "session.input_audio.append", "session.instructions.append", "session.thinking.append",
     "session.commentary.append", "response.item.create"}
)  # fmt: skip


def _param(loc: tuple[Any, ...]) -> str:
    """The field an error names, as OpenAI's ``param`` says it (``session.audio.format``)."""
    names = [str(p) for p in loc if p not in _UNION_TAGS and not str(p).startswith("literal[")]
    return ".".join(names)


def append_tokens(text: str) -> int:
    """An append's length in tokens, as omnilive counts it (no tokenizer at the gateway)."""
    return -(-len(text.encode()) // CHARS_PER_TOKEN)


def refusal(config: SessionConfig) -> ProtocolError | None:
    """What of a ``session.start`` omnilive cannot serve, as its error (None: all of it)."""
    if isinstance(config.delegation, DecisionsDelegation):
        return ProtocolError(
            "unsupported", "Decisions delegation is not served", "session.delegation"
        )
    if config.triggers:
        return ProtocolError("unsupported", "Decisions triggers are not served", "session.triggers")
    if config.store:
        return ProtocolError(
            "unsupported", "stored sessions (forks, downloads) are not served", "session.store"
        )
    if config.client is not None:
        message = "a WebRTC frontend's permissions are not served (no Live WebRTC)"
        return ProtocolError("unsupported", message, "session.client")
    if isinstance(config.delegation, ResponsesDelegation):
        return tools_refusal(config.delegation.responses.tools, "session.delegation.responses")
    return None


def tools_refusal(tools: list[dict[str, Any]] | None, where: str) -> ProtocolError | None:
    """Only function tools: a hosted tool (web search, MCP, shell...) is refused by name."""
    for index, tool in enumerate(tools or []):
        param = f"{where}.tools.{index}"
        if tool.get("type") != "function":
            kind = str(tool.get("type"))[:64]
            return ProtocolError("unsupported", f"the hosted tool {kind!r} is not served", param)
        try:
            FunctionTool.model_validate(tool)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            return ProtocolError("invalid_value", f"{param}.{field}: {first['msg']}", param)
    return None


def update_refusal(config: SessionConfig, change: SessionUpdateConfig) -> ProtocolError | None:
    """Why a ``session.update`` cannot apply to ``config`` (None: it can)."""
    if change.triggers:
        return ProtocolError("unsupported", "Decisions triggers are not served", "session.triggers")
    new = change.delegation
    if new is None:
        return None
    if isinstance(new, DecisionsDelegation):
        return ProtocolError(
            "unsupported", "Decisions delegation is not served", "session.delegation"
        )
    if new.type != config.owner:
        message = f"the delegation type is {config.owner} for the session's life"
        return ProtocolError("immutable_parameter", message, "session.delegation.type")
    if isinstance(new, ResponsesDelegationUpdate) and new.responses is not None:
        return tools_refusal(new.responses.tools, "session.delegation.responses")
    return None
