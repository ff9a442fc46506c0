# ruff: noqa: F811 - the test_slot_engine fixtures, imported, are requested by name
"""A half-duplex session in a slot that a client edits: tools through the
model's own chat template, calls read out of the answer, the context cut to
what was heard and written again from an edited conversation. On the
tests' own tiny model and, where the model's code is at hand, a tiny random
checkpoint of the real architecture (its answers are forced token by token
through the session's ``follow`` hook)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.messages import ChatMessage, HalfDuplexOptions, TextPart, Tools
from tests.minicpmo.test_slot_engine import engine, tiny  # noqa: F401 - the fixtures

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@asynccontextmanager
async def opened(engine: Any, tools: Tools = Tools(), audio: bool = False) -> AsyncIterator[Any]:  # noqa: B008
    view = engine.open_half_duplex()
    try:
        await view.set_tools(tools)  # before prepare: written with the system message
        await view.prepare([TextPart("Be brief.")], HalfDuplexOptions(tts_enabled=audio))
        yield view
    finally:
        view.close()


def tokens(view: Any, text: str) -> list[int]:
    return view._model.shared.tokenizer.encode(text, add_special_tokens=False)


def force(view: Any, text: str) -> None:
    """The next answer says ``text`` (then ends), whatever the weights think."""
    script: Iterator[int] = iter(tokens(view, text + "<|im_end|>"))
    view._session.follow = lambda kind, token, scores: next(script) if kind == "text" else token


async def turn(view: Any, answer: str) -> list[Any]:
    force(view, answer)
    await view.snapshot()
    await view.prefill(np.random.default_rng(1).normal(0, 0.05, 16_000).astype(np.float32))
    return [chunk async for chunk in view.generate()]


async def test_tools_go_into_the_system_message_as_the_chat_template_writes_them(engine):
    async with opened(engine, Tools((WEATHER,))) as view:
        chat_tool = {
            "type": "function",
            "function": {k: v for k, v in WEATHER.items() if k != "type"},
        }
        expected = view._model.shared.tokenizer.apply_chat_template(
            [{"role": "system", "content": "Be brief."}],
            tools=[chat_tool],
            tokenize=False,
            add_generation_prompt=False,
        )
        assert view._session.kv_length == len(tokens(view, expected))


async def test_a_call_is_read_out_of_a_spoken_answer_and_its_output_answered(engine):
    async with opened(engine, Tools((WEATHER,)), audio=True) as view:
        chunks = await turn(view, "Let me look." + CALL)
        calls = [c.tool_call for c in chunks if c.tool_call is not None]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert "".join(c.text for c in chunks) == "Let me look."
        assert any(c.audio is not None for c in chunks)  # what came before the call is voiced
        speech = view._ledger[1]
        speech_start = speech.start
        messages = [
            ChatMessage("system", (TextPart("Be brief."),)),
            ChatMessage("user", (), item_id="item_a"),
            ChatMessage("assistant", (TextPart("Let me look."),), item_id="item_b"),
            ChatMessage("assistant", (), tool_calls=(calls[0],), item_id="item_c"),
            ChatMessage("tool", (TextPart('{"sky": "clear"}'),), tool_call_id=calls[0].call_id),
        ]
        before = view._session.kv_length
        await view.set_history(messages)
        assert [e.kind for e in view._ledger] == ["system", "speech", "assistant", "tool"]
        assert view._ledger[1] is speech and speech.start == speech_start  # not written again
        output = '<|im_start|>user\n<tool_response>\n{"sky": "clear"}\n</tool_response><|im_end|>\n'
        assert view._session.kv_length == before + len(
            tokens(view, "<|tts_eos|><|im_end|>\n" + output)
        )
        force(view, "It is clear in Paris.")
        await view.respond()
        answer = [chunk async for chunk in view.generate()]
        assert "".join(c.text for c in answer) == "It is clear in Paris."


async def test_what_was_heard_replaces_the_answer_in_the_context(engine):
    async with opened(engine) as view:
        await turn(view, "One two three four five.")
        answer = view._ledger[-1]
        assert answer.text == "One two three four five."
        assert await view.keep_heard("One two") is True
        heard = "<|im_end|>\n<|im_start|>assistant\nOne two<|im_end|>\n"
        assert view._session.kv_length == answer.start + len(tokens(view, heard))
        # The next turn opens after the closed answer and is answered.
        chunks = await turn(view, "Three.")
        assert "".join(c.text for c in chunks) == "Three."
        # Nothing heard: the answer leaves the context.
        assert await view.keep_heard("") is True
        assert [e.kind for e in view._ledger][-2:] == ["assistant", "speech"]


async def test_a_truncated_conversation_cuts_the_slot_back_and_a_failed_turn_rolls_back(engine):
    async with opened(engine) as view:
        await turn(view, "Sunny all day.")
        await turn(view, "Rain tomorrow.")
        first_answer = view._ledger[2]
        messages = [
            ChatMessage("system", (TextPart("Be brief."),)),
            ChatMessage("user", (), item_id="a"),
            ChatMessage("assistant", (TextPart("Sunny"),), item_id="b"),
            ChatMessage("user", (), item_id="c"),
            ChatMessage("assistant", (TextPart("Rain tomorrow."),), item_id="d"),
        ]
        await view.set_history(messages)
        kinds = [e.kind for e in view._ledger]
        assert kinds == ["system", "speech", "assistant", "speech", "assistant"]
        assert view._ledger[2] is not first_answer and view._ledger[2].start == first_answer.start
        length, ledger = view._session.kv_length, list(view._ledger)
        await view.snapshot()
        await view.prefill(np.zeros(16_000, np.float32))
        assert view._session.kv_length > length
        await view.rollback()
        assert (view._session.kv_length, view._ledger) == (length, ledger)


async def test_unchanged_tools_write_nothing_and_new_ones_rewrite_from_the_system(engine):
    async with opened(engine) as view:
        await turn(view, "Hello.")
        length = view._session.kv_length
        await view.set_tools(Tools())
        assert view._session.kv_length == length
        await view.set_tools(Tools((WEATHER,)))
        assert view._session.kv_length > length + 50  # the tools' text, the speech after it
        assert [e.kind for e in view._ledger] == ["system", "speech", "assistant"]
        with_tools = view._session.kv_length
        await view.set_tools(Tools((WEATHER,), choice="none"))  # offered none: written without
        without = view._session.kv_length
        assert without < with_tools - 50
        await view.set_tools(Tools((WEATHER,)))
        assert view._session.kv_length == with_tools  # the same text, written the same way


async def test_without_tools_offered_what_looks_like_a_call_is_said_as_it_is(engine):
    async with opened(engine) as view:
        chunks = await turn(view, "Sure.<tool_call> not json")
        assert "".join(c.text for c in chunks) == "Sure.<tool_call> not json"
        assert not any(c.tool_call for c in chunks)


async def test_a_call_that_is_not_json_fails_the_answer_clearly(engine):
    async with opened(engine, Tools((WEATHER,))) as view:
        with pytest.raises(EngineError, match="tool call is not JSON"):
            await turn(view, "<tool_call>\nnot json\n</tool_call>")
        await view.rollback()
        chunks = await turn(view, "Fine.")  # the session goes on
        assert "".join(c.text for c in chunks) == "Fine."
