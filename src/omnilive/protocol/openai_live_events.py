"""The Live API's server events as omnilive sends them: only events of the
``openai`` package's ``ServerEvent`` union (``openai.types.live``), each
with the fields its type requires and no null where its schema has none
(``tests/unit/test_openai_live_events.py`` parses every builder's output
into the package's own types).

Times (``start_ms``, ``end_ms``, ``offset_ms``) are on the session's
timeline: milliseconds of input audio the session has heard since it
started (a client streaming its microphone in real time sees wall time).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from omnilive.ids import mint
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.openai_live import (
    CustomVoice,
    InitialItem,
    PcmFormat,
    ResponsesDelegation,
    SessionConfig,
)

CloseReason = Literal["close_requested", "expired", "content", "remote_hangup", "connection_lost"]
AppendKind = Literal["instructions", "thinking", "commentary"]
Event = dict[str, Any]


def event_id() -> str:
    return mint("event", 8)


def live_event(kind: str, client_event_id: str | None = None, **fields: Any) -> Event:
    """A server event: its ``type``, a fresh ``event_id``, ``fields`` as
    they are now (copied: events are serialised later, in the outbox), and
    the client event it answers, when the client named one."""
    event: Event = {"type": kind, "event_id": event_id(), **copy.deepcopy(fields)}
    if client_event_id is not None:
        event["client_event_id"] = client_event_id
    return event


def error_event(
    code: str,
    message: str,
    param: str | None = None,
    client_event_id: str | None = None,
    kind: str = "invalid_request_error",
) -> Event:
    """``error{error{type, code, message, param, client_event_id}}``."""
    error: dict[str, Any] = {"type": kind, "code": code, "message": message}
    if param is not None:
        error["param"] = param
    if client_event_id is not None:
        error["client_event_id"] = client_event_id
    return live_event("error", client_event_id, error=error)


def refusal_event(refused: ProtocolError[str], kind: str = "invalid_request_error") -> Event:
    """This dialect's presenter of a refusal: its ``error`` event."""
    return error_event(str(refused.code), refused.message, refused.param, refused.event_id, kind)


def info_event(code: str, message: str) -> Event:
    return live_event("info", code=code, message=message)


# --- the session --------------------------------------------------------------------------


def session_resource(session_id: str, config: SessionConfig, expires_at: int) -> dict[str, Any]:
    """The session as ``session.started`` / ``.updated`` / ``.closed`` show it."""
    fmt = config.audio.format
    voice = config.audio.output.voice
    body: dict[str, Any] = {
        "id": session_id,
        "expires_at": expires_at,
        "model": config.model,
        "status": "active",
        "audio": {
            "format": {"type": fmt.type, "rate": fmt.rate if isinstance(fmt, PcmFormat) else 8000},
            "output": {"voice": voice.model_dump() if isinstance(voice, CustomVoice) else voice},
        },
        "delegation": _delegation(config),
        "store": False,
    }
    if config.instructions is not None:
        body["instructions"] = config.instructions
    if config.input:
        body["input"] = [_initial(item) for item in config.input]
    if config.safety_identifier is not None:
        body["safety_identifier"] = config.safety_identifier
    return body


def _delegation(config: SessionConfig) -> dict[str, Any]:
    delegation = config.delegation
    delay = config.acknowledgement_delay_ms
    if isinstance(delegation, ResponsesDelegation):
        responses = delegation.responses.model_dump(mode="json", exclude_none=True)
        return {"type": "responses", "responses": responses, "acknowledgement_delay_ms": delay}
    return {"type": "client", "acknowledgement_delay_ms": delay}


def _initial(item: InitialItem) -> dict[str, Any]:
    part_type = "output_text" if item.role == "assistant" else "input_text"
    return {
        "type": "message",
        "role": item.role,
        "content": [{"type": part_type, "text": item.text}],
    }


def usage(seconds: float) -> dict[str, Any]:
    """Cumulative billable duration, in whole seconds (OpenAI's rounding)."""
    return {"seconds": float(int(max(0.0, seconds)))}


def session_started(resource: dict[str, Any], client_event_id: str | None) -> Event:
    return live_event("session.started", client_event_id, session=resource)


def session_updated(resource: dict[str, Any], client_event_id: str | None) -> Event:
    return live_event("session.updated", client_event_id, session=resource)


def session_closed(
    resource: dict[str, Any], reason: CloseReason, seconds: float, client_event_id: str | None
) -> Event:
    return live_event(
        "session.closed", client_event_id, session=resource, reason=reason, usage=usage(seconds)
    )


def usage_updated(seconds: float, usage_ratio: float | None) -> Event:
    """Audio usage so far and the context window's fill (omitted when unknown)."""
    fields: dict[str, Any] = {"usage": usage(seconds)}
    if usage_ratio is not None:
        fields["context_window"] = {"usage_ratio": round(max(0.0, usage_ratio), 4)}
    return live_event("session.usage.updated", **fields)


# --- what the client sent, acknowledged -------------------------------------------------


def appended(kind: AppendKind, start_ms: int, end_ms: int, client_event_id: str | None) -> Event:
    return live_event(
        f"session.{kind}.appended", client_event_id, start_ms=start_ms, end_ms=max(start_ms, end_ms)
    )


def muted(client_event_id: str | None, on: bool) -> Event:
    kind = "session.input_audio.muted" if on else "session.input_audio.unmuted"
    return live_event(kind, client_event_id)


# --- the conversation ------------------------------------------------------------------------


def output_audio(delta_b64: str) -> Event:
    """A piece of the model's speech; the primary WebSocket's carry no times."""
    return {"type": "session.output_audio.delta", "delta": delta_b64}


def transcript(
    direction: Literal["input", "output"], text: str, start_ms: int, end_ms: int
) -> Event:
    return live_event(
        f"session.{direction}_transcript.delta",
        delta=text,
        start_ms=start_ms,
        end_ms=max(start_ms, end_ms),
    )


def delegation_created(
    delegation_id: str,
    target: Literal["client", "responses"],
    offset_ms: int,
    response_id: str | None = None,
) -> Event:
    delegation: dict[str, Any] = {"id": delegation_id, "target": target, "type": "delegation"}
    if response_id is not None:
        delegation["response_id"] = response_id
    return live_event("session.delegation.created", delegation=delegation, offset_ms=offset_ms)


def response_event(event: dict[str, Any], delegation_id: str | None) -> Event:
    """One of the backend's Responses streaming events, wrapped."""
    fields: dict[str, Any] = {"event": event}
    if delegation_id is not None:
        fields["delegation_id"] = delegation_id
    return live_event("response.event", **fields)
