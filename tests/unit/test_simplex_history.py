"""The MiniCPM-o half-duplex ledger: how an edited conversation maps onto
what the slot holds, and how an answer's function calls are read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.messages import ChatMessage, TextPart, ToolCall, Tools
from omnilive.engines.minicpmo.sessions.simplex import history as simplex_history
from omnilive.engines.minicpmo.sessions.simplex.history import Entry, ToolCallScanner

call_text, first_difference = simplex_history.call_text, simplex_history.first_difference
system_text, tools_block = simplex_history.system_text, simplex_history.tools_block
wanted = simplex_history.wanted

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def message(role: str, text: str = "", item_id: str | None = None, **kw) -> ChatMessage:
    parts = (TextPart(text),) if text else ()
    return ChatMessage(role, parts, item_id=item_id, **kw)


def ledger_of_two_turns() -> list[Entry]:
    return [
        Entry("system", "Be brief.", start=0),
        Entry("speech", speech=np.zeros(16_000, np.float32), start=20),
        Entry("assistant", "It is sunny in Paris today.", start=60),
        Entry("speech", speech=np.ones(16_000, np.float32), start=80),
        Entry("assistant", "Tomorrow it rains.", start=120),
    ]


def test_tools_are_written_as_the_chat_template_writes_them():
    block = tools_block(Tools((WEATHER,)))
    head, _, rest = block.partition("<tools>\n")
    listed, _, tail = rest.partition("\n</tools>")
    assert head.startswith("# Tools\n\nYou may call one or more functions")
    assert json.loads(listed) == {
        "type": "function",
        "function": {k: v for k, v in WEATHER.items() if k != "type"},
    }
    assert tail.endswith("</tool_call>")
    assert system_text("Be brief.", Tools((WEATHER,))) == "Be brief.\n\n" + block
    assert system_text("Be brief.", Tools()) == "Be brief."
    assert tools_block(Tools((WEATHER,), choice="none")) == ""
    assert tools_block(Tools((WEATHER,), choice="required")).endswith(
        "Call one of these functions now."
    )


def test_an_unchanged_conversation_reuses_every_entry_and_binds_speech_to_its_item():
    ledger = ledger_of_two_turns()
    messages = [
        message("system", "Be brief."),
        message("user", "", "item_a"),  # speech without a transcript
        message("assistant", "It is sunny in Paris today.", "item_b"),
        message("user", "And tomorrow?", "item_c"),  # with one
        message("assistant", "Tomorrow it rains.", "item_d"),
    ]
    entries = wanted(ledger, "Be brief.", messages)
    assert first_difference(ledger, entries) == len(ledger) == len(entries)
    assert (ledger[1].item_id, ledger[3].item_id) == ("item_a", "item_c")


def test_a_truncated_answer_is_written_again_from_its_place():
    ledger = ledger_of_two_turns()
    messages = [
        message("system", "Be brief."),
        message("user", "", "item_a"),
        message("assistant", "It is sunny", "item_b"),  # what the user heard
        message("user", "", "item_c"),
        message("assistant", "Tomorrow it rains.", "item_d"),
    ]
    entries = wanted(ledger, "Be brief.", messages)
    assert first_difference(ledger, entries) == 2
    assert entries[2].text == "It is sunny" and entries[2] is not ledger[2]
    assert entries[3] is ledger[3]  # the later speech is written again as speech


def test_a_deleted_turn_cuts_the_context_there_and_keeps_the_later_speech_by_its_id():
    ledger = ledger_of_two_turns()
    named = ["system", "item_a", "item_b", "item_c", "item_d"]
    wanted(ledger, "Be brief.", [message("system", "Be brief.")] + [
        message(e.kind if e.kind != "speech" else "user", e.text, name)
        for e, name in zip(ledger[1:], named[1:], strict=True)
    ])  # fmt: skip
    messages = [
        message("system", "Be brief."),
        message("user", "", "item_c"),
        message("assistant", "Tomorrow it rains.", "item_d"),
    ]
    entries = wanted(ledger, "Be brief.", messages)
    assert first_difference(ledger, entries) == 1
    assert entries[1] is ledger[3]  # the same recording, by its item id
    assert entries[2].kind == "assistant" and entries[2] is not ledger[4]


def test_new_tools_or_instructions_rewrite_everything_and_calls_merge_into_their_answer():
    ledger = ledger_of_two_turns()[:3]
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [
        message("system", "Be brief."),
        message("user", "", "item_a"),
        message("assistant", "Let me look.", "item_b"),
        ChatMessage("assistant", (), tool_calls=(call,), item_id="item_c"),
        ChatMessage("tool", (TextPart('{"sky": "clear"}'),), tool_call_id="call_1"),
    ]
    entries = wanted(ledger, system_text("Be brief.", Tools((WEATHER,))), messages)
    assert first_difference(ledger, entries) == 0
    assert entries[1] is ledger[1]  # the speech survives the new system message
    assert entries[2].calls == (("get_weather", '{"city": "Paris"}'),)
    assert entries[2].text == "Let me look."
    assert entries[3].kind == "tool"
    assert call_text(entries[2].calls) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )


def scan(pieces: list[str]) -> tuple[str, list[ToolCall]]:
    scanner = ToolCallScanner()
    said, calls = "", []
    for piece in pieces:
        text, made = scanner.feed(piece)
        said, calls = said + text, calls + made
    text, made = scanner.finish()
    return said + text, calls + made


def test_a_call_split_over_pieces_is_read_and_not_said():
    said, calls = scan(
        ["Let me check. <tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Par',
         'is"}}\n</tool_call>']
    )  # fmt: skip
    assert said == "Let me check. "
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0].call_id.startswith("call_")


def test_text_that_only_looks_like_a_call_is_said():
    assert scan(["a <tool", " belt"]) == ("a <tool belt", [])
    assert scan(["ends with <tool"]) == ("ends with <tool", [])


def test_arguments_given_as_a_string_and_a_call_left_open_are_read():
    said, calls = scan(['<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}'])
    assert said == "" and calls[0].name == "f" and json.loads(calls[0].arguments) == {"x": 1}


@pytest.mark.parametrize(
    "call", ["not json", '{"arguments": {}}', '["get_weather"]', '{"name": "f", "arguments": "{"}']
)
def test_a_call_that_cannot_be_read_is_an_error(call: str):
    with pytest.raises(EngineError, match="tool call"):
        scan([f"<tool_call>{call}</tool_call>"])


def test_entries_count_the_clients_messages_they_stand_for():
    """``history_dropped`` counts the client's messages: merged assistant
    messages are one entry of two, a text-less one joins the entry before it
    (before the first: the system entry's, never held)."""
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [
        message("system", "Be brief."),
        message("user", "", item_id="speech_0"),  # untranscribed, not in the ledger
        message("user", "Weather?", item_id="u1"),
        message("assistant", "Let me look.", item_id="a1"),
        message("assistant", item_id="c1", tool_calls=(call,)),
        message("tool", "sunny", item_id="o1", tool_call_id="call_1"),
        message("assistant", "", item_id="a2"),  # said nothing
    ]
    entries = wanted([], "Be brief.", messages)
    assert [e.kind for e in entries] == ["system", "user", "assistant", "tool"]
    assert [e.span for e in entries] == [1, 1, 2, 2]
    assert sum(e.span for e in entries) == len(messages) - 1
