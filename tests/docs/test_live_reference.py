"""The Live API's reference names every client event omnilive takes or
refuses, and every server event it sends (``docs/reference/openai-live.md``)."""

from __future__ import annotations

from pathlib import Path

from omnilive.protocol.openai_live import CLIENT_EVENT_TYPES, UNSUPPORTED_EVENTS

PAGE = Path(__file__).parents[2] / "docs" / "reference" / "openai-live.md"
SENT = (
    "session.started", "session.updated", "session.closed", "session.input_audio.muted",
    "session.output_audio.delta", "session.output_transcript.delta",
    "session.input_transcript.delta", "session.delegation.created", "response.event",
    "session.usage.updated", "info", "error",
)  # fmt: skip


def test_every_live_event_is_named() -> None:
    text = PAGE.read_text()
    named = [*sorted(CLIENT_EVENT_TYPES), *sorted(UNSUPPORTED_EVENTS), *SENT]
    assert [kind for kind in named if f"`{kind}`" not in text] == []
