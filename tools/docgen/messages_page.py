"""docs/reference/messages.md from the protocol models: every client message and its fields."""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from omnilive.protocol import chat, duplex, half_duplex, openai_realtime, realtime, realtime_v2
from tools.docgen.markdown import code, default_text, models_in, page_head, table, type_name


@dataclass(frozen=True)
class Protocol:
    """One wire protocol: where it is served, and the union of what a client may send."""

    title: str
    endpoint: str
    messages: Any  # a union (plain or Annotated) of pydantic models, or one model
    module: str


PROTOCOLS = (
    Protocol("Turn-based chat", "WS /ws/chat, POST /api/chat", chat.ChatRequest, "chat"),
    Protocol(
        "Half-duplex", "WS /ws/half_duplex/{session_id}", half_duplex.ClientMessage, "half_duplex"
    ),
    Protocol("Full duplex", "WS /ws/duplex/{session_id}", duplex.ClientMessage, "duplex"),
    Protocol(
        "Realtime API, older dialect", "WS /v1/realtime?mode=…", realtime.ClientEvent, "realtime"
    ),
    Protocol(
        "Realtime API, newer dialect",
        "WS /v1/realtime?mode=…",
        realtime_v2.ClientEvent,
        "realtime_v2",
    ),
    Protocol(
        "OpenAI Realtime API (GA)",
        "WS /v1/realtime?model=…",
        openai_realtime.ClientEvent,
        "openai_realtime",
    ),
)


def top_models(protocol: Protocol) -> list[type[BaseModel]]:
    """The messages a client of ``protocol`` may send, in the union's order."""
    return models_in(protocol.messages)


def message_type(model: type[BaseModel]) -> str | None:
    """The ``type`` a message of this model carries, if it is a typed message."""
    field = model.model_fields.get("type")
    if field is None:
        return None
    args = typing.get_args(field.annotation)
    return str(args[0]) if typing.get_origin(field.annotation) is typing.Literal else None


def nested_models(model: type[BaseModel], seen: list[type[BaseModel]]) -> list[type[BaseModel]]:
    """Models inside ``model``'s fields, depth first, each once."""
    found: list[type[BaseModel]] = []
    for field in model.model_fields.values():
        for inner in models_in(field.annotation):
            if inner not in seen and inner not in found:
                found.append(inner)
                found += nested_models(inner, [*seen, *found])
    return found


def _fields_table(model: type[BaseModel]) -> str:
    rows = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        default = (
            "required"
            if field.is_required()
            else code(default_text(field.get_default(call_default_factory=True)))
        )
        kind = code(type_name(field.annotation))
        rows.append([code(wire), kind, default, field.description or ""])
    if not rows:
        return "No fields beyond its `type`.\n"
    return table(["field", "type", "default", "description"], rows)


def _title(model: type[BaseModel]) -> str:
    kind = message_type(model)
    return f"`{kind}`" if kind else f"`{model.__name__}`"


def render() -> str:
    out = [
        page_head(
            "Client messages",
            "src/omnilive/protocol/",
            "Every message a client may send, per protocol, with its fields as the server's "
            "own models (`src/omnilive/protocol/`) define them. What each message does, and "
            "what the server answers, is in the [WebSocket API](websocket.md), the "
            "[OpenAI Realtime API](openai-realtime.md) and the [HTTP API](http.md). Unknown "
            "fields are ignored unless a protocol says otherwise; a field of the wrong type is "
            "`invalid_request` ([Error codes](errors.md)).",
        )
    ]
    for protocol in PROTOCOLS:
        out.append(f"\n## {protocol.title}\n\n`{protocol.endpoint}`, ")
        out.append(f"`omnilive.protocol.{protocol.module}`.\n")
        tops = top_models(protocol)
        for model in tops:
            out.append(f"\n### {_title(model)}\n\n")
            doc = inspect.cleandoc(model.__doc__ or "")
            if doc and not doc.startswith(model.__name__ + "("):
                out.append(doc + "\n\n")
            out.append(_fields_table(model))
        for model in nested_models_of(tops):
            out.append(f"\n#### `{model.__name__}` ({protocol.module})\n\n")
            out.append(_fields_table(model))
    return "".join(out)


def nested_models_of(tops: list[type[BaseModel]]) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for model in tops:
        found += [m for m in nested_models(model, [*tops, *found]) if m not in found]
    return found
