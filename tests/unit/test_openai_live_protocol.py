"""The Live dialect's events against the ``openai`` package's own types:
every server event omnilive builds parses (strictly: pydantic's validation,
not the SDK's lenient construct) into ``openai.types.live.ServerEvent``, and
every client event the SDK's ``client.live`` sends parses into ours."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.live import ServerEvent
from pydantic import TypeAdapter

from omnilive.protocol import openai_live_events as ev
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.openai_live import (
    CommentaryAppend,
    SessionConfig,
    SessionStart,
    SessionUpdateConfig,
    append_tokens,
    parse_client_event,
    refusal,
    update_refusal,
)

SERVER = TypeAdapter(ServerEvent)
TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city"}


def strict(event: dict[str, Any]) -> Any:
    """The event as the openai package types it, through JSON as on the wire."""
    parsed = SERVER.validate_json(json.dumps(event))
    assert parsed.type == event["type"]
    return parsed


def config(**fields: Any) -> SessionConfig:
    return SessionConfig.model_validate({"model": "gpt-live-1", **fields})


def test_session_events_parse_into_openai_types() -> None:
    responses = config(
        instructions="be brief",
        audio={"format": {"type": "audio/pcmu", "rate": 8000}, "output": {"voice": {"id": "v1"}}},
        delegation={"type": "responses", "responses": {"model": "m", "tools": [TOOL]}},
        input=[{"role": "user", "content": [{"text": "hi"}]}],
    )
    for session in (config(), responses):
        resource = ev.session_resource("live_x", session, 1700000000)
        started = strict(ev.session_started(resource, "c1"))
        assert started.client_event_id == "c1" and started.session.model == "gpt-live-1"
        strict(ev.session_updated(resource, None))
        closed = strict(ev.session_closed(resource, "close_requested", 3.7, None))
        assert closed.usage.seconds == 3.0
    assert strict(ev.usage_updated(2.0, 0.25)).context_window.usage_ratio == 0.25
    assert strict(ev.usage_updated(2.0, None)).context_window is None


def test_conversation_events_parse_into_openai_types() -> None:
    for kind in ("instructions", "thinking", "commentary"):
        assert strict(ev.appended(kind, 100, 90, "c")).end_ms == 100
    strict(ev.muted("c", True))
    strict(ev.muted(None, False))
    strict(ev.output_audio("AAAA"))
    assert strict(ev.transcript("input", "hello", 0, 800)).end_ms == 800
    strict(ev.transcript("output", "hi", 1000, 1500))
    created = strict(ev.delegation_created("dlg_1", "client", 1200))
    assert created.delegation.id == "dlg_1" and created.offset_ms == 1200
    strict(ev.delegation_created("dlg_2", "responses", 1200, "resp_1"))
    strict(ev.response_event({"type": "response.output_text.delta", "delta": "x"}, "dlg_2"))
    error = strict(ev.error_event("unsupported", "no", "type", "c9"))
    assert error.error.client_event_id == "c9" and error.client_event_id == "c9"
    strict(ev.info_event("queued", "position 1"))


def test_the_sdk_events_parse() -> None:
    start = parse_client_event(
        {"type": "session.start", "event_id": "e1", "session": {"model": "gpt-live-1"}}
    )
    assert isinstance(start, SessionStart) and start.session.owner == "client"
    append = parse_client_event(
        {"type": "session.commentary.append", "content": "sunny", "delegation_id": None}
    )
    assert isinstance(append, CommentaryAppend)


@pytest.mark.parametrize(
    ("data", "code", "param"),
    [
        ({"type": "decision.create", "event_id": "d"}, "unsupported", "type"),
        ({"type": "session.output_audio.fixture.play", "audio": "AAAA"}, "unsupported", "type"),
        ({"type": "nope"}, "invalid_value", "type"),
        ({"event_id": "x"}, "missing_required_parameter", "type"),
        ({"type": "session.start", "session": {}}, "missing_required_parameter", "session.model"),
        (
            {"type": "session.start",
             "session": {"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}}},
            "invalid_value",
            "session.audio.format.rate",
        ),
        ({"type": "session.input_audio.append", "audio": "not base64!"}, "invalid_value", "audio"),
        ({"type": "session.thinking.append", "content": ""}, "invalid_value", "content"),
    ],
)  # fmt: skip
def test_bad_events_are_named_errors(data: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_event(data)
    assert (caught.value.code, caught.value.param) == (code, param)


def test_what_cannot_be_served_is_refused_by_name() -> None:
    assert refusal(config()) is None
    cases = {
        "session.delegation": config(delegation={"type": "decisions", "decisions": {}}),
        "session.triggers": config(triggers=[{"type": "decisions"}]),
        "session.store": config(store=True),
        "session.delegation.responses.tools.0": config(
            delegation={"type": "responses",
                        "responses": {"model": "m", "tools": [{"type": "web_search"}]}}
        ),
    }  # fmt: skip
    for param, session in cases.items():
        refused = refusal(session)
        assert refused is not None and refused.param == param and refused.code == "unsupported"


def test_updates_keep_the_owner_and_merge() -> None:
    session = config(delegation={"type": "responses", "responses": {"model": "m", "tools": [TOOL]}})
    to_client = SessionUpdateConfig.model_validate({"delegation": {"type": "client"}})
    refused = update_refusal(session, to_client)
    assert refused is not None and refused.code == "immutable_parameter"
    change = SessionUpdateConfig.model_validate(
        {"delegation": {"type": "responses", "responses": {"instructions": "new"}}}
    )
    assert update_refusal(session, change) is None
    updated = session.updated(change)
    assert updated.delegation.responses.instructions == "new"  # type: ignore[union-attr]
    assert updated.delegation.responses.model == "m"  # type: ignore[union-attr]


def test_append_tokens_are_counted_by_bytes() -> None:
    assert append_tokens("abcd") == 1 and append_tokens("abcde") == 2
