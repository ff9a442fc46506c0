"""The OpenAI Realtime (GA) dialect's decoders under hypothesis: every frame
a client may send is taken or refused with a documented ``error`` code, at
the gateway (its machine) and on the worker (the OpenAI Realtime runner and
the duplex one, fed what the gateway passed on); the worker never fails on
its own."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnilive.gateway.openai.machine import OpenAIRealtimeMachine
from omnilive.gateway.realtime.machine import ToClient, ToWorker
from omnilive.protocol.openai_realtime import ERROR_CODES, parse_client_event
from tests.security import fuzzing
from tests.security.test_fuzz_decoders import _run_worker_session, examples, worker  # noqa: F401

pcm = st.integers(1, 4000).map(
    lambda n: base64.b64encode((np.sin(np.arange(n) / 7) * 8000).astype("<i2").tobytes()).decode()
)
audio = st.one_of(pcm, pcm, fuzzing.audio)
ids = st.one_of(st.sampled_from(["item_1", "root", "", "x" * 80]), fuzzing.texts)
content = st.lists(
    fuzzing.message(
        st.sampled_from(["input_text", "input_audio", "output_text", "text", "bogus"]),
        text=fuzzing.texts,
        audio=audio,
        transcript=fuzzing.texts,
    ),
    max_size=3,
)
item = st.one_of(
    fuzzing.message(
        st.sampled_from(["message", "function_call", "function_call_output", "nope"]),
        id=ids,
        role=st.sampled_from(["user", "assistant", "system", "robot"]),
        content=content,
        call_id=ids,
        name=fuzzing.texts,
        arguments=fuzzing.texts,
        output=fuzzing.texts,
    ),
    fuzzing.json_values,
)
tool = fuzzing.message(
    st.just("function"),
    name=st.sampled_from(["get_weather", "bad name", ""]),
    parameters=fuzzing.json_values,
)
session = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "instructions": fuzzing.texts,
            "output_modalities": st.lists(st.sampled_from(["text", "audio", "x"]), max_size=3),
            "tools": st.lists(tool, max_size=2),
            "tool_choice": st.one_of(
                st.sampled_from(["auto", "none", "required"]), fuzzing.json_values
            ),
            "max_output_tokens": fuzzing.numbers,
            "audio": st.fixed_dictionaries(
                {},
                optional={
                    "input": st.fixed_dictionaries(
                        {},
                        optional={
                            "format": st.fixed_dictionaries(
                                {"type": st.sampled_from(["audio/pcm", "audio/pcmu", "audio/x"])}
                            ),
                            "turn_detection": st.one_of(
                                st.none(),
                                fuzzing.message(
                                    st.sampled_from(["server_vad", "semantic_vad", "x"]),
                                    threshold=fuzzing.numbers,
                                    silence_duration_ms=fuzzing.numbers,
                                    eagerness=fuzzing.texts,
                                ),
                            ),
                            "transcription": fuzzing.json_values,
                        },
                    )
                },
            ),
        },
    ),
    fuzzing.json_values,
)
event = st.one_of(
    fuzzing.message(st.just("session.update"), session=session, event_id=fuzzing.texts),
    fuzzing.message(st.just("input_audio_buffer.append"), audio=audio),
    fuzzing.message(
        st.sampled_from(
            [
                "input_audio_buffer.commit",
                "input_audio_buffer.clear",
                "response.cancel",
                "output_audio_buffer.clear",
            ]
        )
    ),
    fuzzing.message(st.just("conversation.item.create"), item=item, previous_item_id=ids),
    fuzzing.message(
        st.sampled_from(["conversation.item.retrieve", "conversation.item.delete"]), item_id=ids
    ),
    fuzzing.message(
        st.just("conversation.item.truncate"),
        item_id=ids,
        content_index=fuzzing.numbers,
        audio_end_ms=fuzzing.numbers,
    ),
    fuzzing.message(
        st.just("response.create"),
        response=st.one_of(
            fuzzing.json_values,
            st.fixed_dictionaries(
                {},
                optional={
                    "instructions": fuzzing.texts,
                    "conversation": fuzzing.texts,
                    "input": st.lists(item, max_size=2),
                    "output_modalities": fuzzing.json_values,
                },
            ),
        ),
    ),
    fuzzing.message(fuzzing._typed(["session.init", "input.append", "bogus"]), x=fuzzing.texts),
)
frames = fuzzing.frames_of(event)


def _documented(message: dict[str, Any]) -> None:
    assert message["type"] == "error" and message["error"]["code"] in ERROR_CODES, message


@examples(1500)
@given(raw=frames)
def test_gateway_machine(raw: str | bytes):
    machine = OpenAIRealtimeMachine("sess_f", "m", 1 << 20)
    machine.attach_worker()
    for action in machine.client_frame(raw):
        if isinstance(action, ToClient):
            _documented(action.event)
        else:
            assert isinstance(action, ToWorker)
            parse_client_event(action.message)  # what reaches the worker is well-formed


@pytest.mark.parametrize("model", ["m", "m-duplex"])
@examples(100)
@given(data=st.data())
def test_worker_runners(worker: tuple[Any, ...], model: str, data: st.DataObject):  # noqa: F811
    machine = OpenAIRealtimeMachine("sess_f", model, 1 << 20)
    to_worker = [json.dumps(a.message) for a in machine.attach_worker()]
    for raw in data.draw(st.lists(frames, min_size=1, max_size=8)):
        to_worker += [
            json.dumps(a.message) for a in machine.client_frame(raw) if isinstance(a, ToWorker)
        ]
    _run_worker_session(worker, machine.worker_kind, to_worker, check=_documented)
