"""What an OpenAI Realtime (GA) session holds while it waits for a worker,
as ``docs/design/decisions.md`` ("Drop-oldest backlogs") says: up to 256
events; past that its oldest audio goes, and once no audio is left, a new
event is refused (``too_many_events``) and the ones held are kept."""

from __future__ import annotations

import json

from omnilive.gateway.openai.machine import MAX_HELD_EVENTS, OpenAIRealtimeMachine
from omnilive.gateway.realtime.machine import ToClient, ToWorker

APPEND = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})


def item(n: int) -> str:
    content = [{"type": "input_text", "text": f"item {n}"}]
    message = {"type": "message", "role": "user", "content": content}
    return json.dumps({"type": "conversation.item.create", "item": message})


def held_texts(machine: OpenAIRealtimeMachine) -> list[str]:
    start, *held = [a.message for a in machine.attach_worker() if isinstance(a, ToWorker)]
    assert start["type"] == "internal.openai"
    return [e["item"]["content"][0]["text"] for e in held]


def test_audio_goes_first_then_new_events_are_refused_and_the_held_kept():
    machine = OpenAIRealtimeMachine("sess_test", "m", 1 << 20)
    assert machine.client_frame(APPEND) == []
    for n in range(MAX_HELD_EVENTS - 1):
        assert machine.client_frame(item(n)) == []
    assert machine.client_frame(item(MAX_HELD_EVENTS - 1)) == []  # the audio made room
    assert machine.dropped_appends == 1
    [refused] = machine.client_frame(item(MAX_HELD_EVENTS))
    assert isinstance(refused, ToClient) and refused.event["error"]["code"] == "too_many_events"
    texts = held_texts(machine)
    assert texts == [f"item {n}" for n in range(MAX_HELD_EVENTS)]  # the oldest, all of them
