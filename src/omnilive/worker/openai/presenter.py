"""An answer in the OpenAI Realtime API's (GA) events, without I/O.

The OpenAI Realtime runner hands a :class:`ResponsePresenter` what the engine
made (text, speech, tool calls) and sends the events it returns: one
``response.created``, then per output item ``response.output_item.added``
and ``conversation.item.added``, its content part, the deltas, their
``done`` events, and ``response.done`` with the response's items and usage.
An output item joins the conversation when it is added (a client may
truncate the answer it is hearing), not when the response is done.

Fields are left out rather than sent as ``null`` where OpenAI's schema
gives them no null (``tests/openai_clients`` type-checks every event with
the ``openai`` package's TypeScript types), but for one the clients need
(:func:`speech_item`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnilive.audio_codecs import encode_output
from omnilive.engines.messages import ToolCall
from omnilive.ids import mint
from omnilive.protocol.openai_realtime import ItemDelete, ItemRetrieve, ItemTruncate, server_event
from omnilive.worker.openai.items import Conversation

Event = dict[str, Any]


def item_id() -> str:
    return mint("item_", 12)


@dataclass
class _Message:
    item: Event
    output_index: int
    audio: bool
    text: str = ""
    audio_ms: float = 0.0


@dataclass
class ResponsePresenter:
    """One response's events. ``audio``: the answer is spoken (its text is
    the audio's transcript); else it is text."""

    audio: bool
    audio_format: str
    # Where the output items go as they are added; None: out of band (a
    # response with ``conversation: "none"``), no ``conversation.item.*`` events.
    conversation: Conversation | None
    metadata: dict[str, Any] | None = None
    id: str = field(default_factory=lambda: mint("resp_", 12))
    output: list[Event] = field(default_factory=list)
    _message: _Message | None = None

    def _ids(self, message: _Message) -> Event:
        return {
            "response_id": self.id,
            "item_id": message.item["id"],
            "output_index": message.output_index,
            "content_index": 0,
        }

    def _response(self, status: str, **extra: Any) -> Event:
        modalities = ["audio"] if self.audio else ["text"]
        response = {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "output": list(self.output),
            "output_modalities": modalities,
            "metadata": self.metadata,
            **extra,
        }
        if self.conversation is not None:
            response["conversation_id"] = "conv_default"
        return response

    def created(self) -> list[Event]:
        return [server_event("response.created", response=self._response("in_progress"))]

    def _added(self, item: Event) -> list[Event]:
        index = len(self.output)
        self.output.append(item)
        events = [
            server_event(
                "response.output_item.added", response_id=self.id, output_index=index, item=item
            )
        ]
        if self.conversation is not None:
            previous = self.conversation.add(item, answer=True)
            events.append(
                server_event("conversation.item.added", previous_item_id=previous, item=item)
            )
        return events

    def _start_message(self) -> tuple[_Message, list[Event]]:
        if self._message is not None:
            return self._message, []
        kind = "output_audio" if self.audio else "output_text"
        item: Event = {
            "id": item_id(),
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        events = self._added(item)
        message = _Message(item, len(self.output) - 1, self.audio)
        self._message = message
        part = {"type": "audio", "transcript": ""} if self.audio else {"type": "text", "text": ""}
        item["content"] = [{"type": kind, **{k: v for k, v in part.items() if k != "type"}}]
        events.append(server_event("response.content_part.added", **self._ids(message), part=part))
        return message, events

    def chunk(self, text: str, audio: np.ndarray | None) -> list[Event]:
        """A piece of the spoken (or written) answer."""
        if not text and audio is None:
            return []
        message, events = self._start_message()
        if text:
            message.text += text
            kind = (
                "response.output_audio_transcript.delta"
                if self.audio
                else "response.output_text.delta"
            )
            events.append(server_event(kind, **self._ids(message), delta=text))
        if audio is not None and self.audio and audio.size:
            message.audio_ms += audio.size / 24.0
            delta = encode_output(audio, self.audio_format)
            events.append(
                server_event("response.output_audio.delta", **self._ids(message), delta=delta)
            )
        return events

    def _finish_message(self) -> list[Event]:
        message, self._message = self._message, None
        if message is None:
            return []
        ids = self._ids(message)
        if message.audio:
            part = {"type": "audio", "transcript": message.text}
            message.item["content"] = [{"type": "output_audio", "transcript": message.text}]
            events = [
                server_event("response.output_audio.done", **ids),
                server_event(
                    "response.output_audio_transcript.done", **ids, transcript=message.text
                ),
            ]
        else:
            part = {"type": "text", "text": message.text}
            message.item["content"] = [{"type": "output_text", "text": message.text}]
            events = [server_event("response.output_text.done", **ids, text=message.text)]
        events.append(server_event("response.content_part.done", **ids, part=part))
        return events + self._item_done(message.item, message.output_index)

    def _item_done(self, item: Event, index: int) -> list[Event]:
        item["status"] = "completed" if item.get("status") == "in_progress" else item["status"]
        events = [
            server_event(
                "response.output_item.done", response_id=self.id, output_index=index, item=item
            )
        ]
        if self.conversation is not None:
            events.append(server_event("conversation.item.done", item=item))
        return events

    def tool_call(self, call: ToolCall) -> list[Event]:
        """A function call the model made: its item, its arguments streamed, done."""
        events = self._finish_message()
        item = {
            "id": item_id(),
            "object": "realtime.item",
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": "",
        }
        events += self._added(item)
        index = len(self.output) - 1
        ids = {
            "response_id": self.id,
            "item_id": item["id"],
            "output_index": index,
            "call_id": call.call_id,
        }
        events.append(
            server_event("response.function_call_arguments.delta", **ids, delta=call.arguments)
        )
        item["arguments"] = call.arguments
        events.append(
            server_event(
                "response.function_call_arguments.done",
                **ids,
                name=call.name,
                arguments=call.arguments,
            )
        )
        return events + self._item_done(item, index)

    def done(
        self, status: str, usage: Event, reason: str | None = None, error: Event | None = None
    ) -> list[Event]:
        """The response is over: ``completed``, ``cancelled`` (``reason``:
        ``client_cancelled`` or ``turn_detected``), ``incomplete`` or
        ``failed`` (``error``: ``{type, code, message}``)."""
        message = self._message
        if message is not None and status != "completed":
            message.item["status"] = "incomplete"
        events = self._finish_message()
        extra: Event = {"usage": usage}
        if status != "completed":
            details = {"type": status, "reason": reason, "error": error}
            extra["status_details"] = {k: v for k, v in details.items() if v is not None}
        response = self._response(status, **extra)
        return [*events, server_event("response.done", response=response)]

    def is_output(self, item_id: str) -> bool:
        """Whether ``item_id`` is one of this response's output items."""
        return any(item["id"] == item_id for item in self.output)

    @property
    def spoken_ms(self) -> float:
        return self._message.audio_ms if self._message is not None else 0.0


def usage(heard_tokens: int, output_tokens: int, audio: bool) -> Event:
    """A response's usage, as OpenAI counts it: the speech the engine heard
    for it (text items are not counted) and what it said (text or audio)."""
    out_audio = output_tokens if audio else 0
    return {
        "total_tokens": heard_tokens + output_tokens,
        "input_tokens": heard_tokens,
        "output_tokens": output_tokens,
        "input_token_details": {
            "text_tokens": 0,
            "audio_tokens": heard_tokens,
            "cached_tokens": 0,
            "image_tokens": 0,
        },
        "output_token_details": {
            "text_tokens": output_tokens - out_audio,
            "audio_tokens": out_audio,
        },
    }


# --- the user's side, the same in both of the dialect's runners ------------------------------


def speech_item(new_id: str) -> Event:
    """A user's committed speech, its transcript to come (:func:`set_transcript`).
    Until then the transcript is null, not absent, as on OpenAI's server: the
    JS Agents SDK's item schema requires the field (its TypeScript type says
    optional, the one place omnilive follows the clients over the type)."""
    return {
        "id": new_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": None}],
    }


def set_transcript(item: Event, transcript: str | None) -> None:
    """A speech item's transcript (None: the engine could not transcribe it)."""
    item["content"][0]["transcript"] = transcript


def transcript_of(item: Event) -> str | None:
    transcript: str | None = item["content"][0].get("transcript")
    return transcript


def speech_started(at_ms: float, new_id: str) -> Event:
    return server_event(
        "input_audio_buffer.speech_started", audio_start_ms=round(at_ms), item_id=new_id
    )


def committed(item: Event, previous: str | None) -> list[Event]:
    """The buffer became ``item``, now in the conversation after ``previous``."""
    return [
        server_event("input_audio_buffer.committed", previous_item_id=previous, item_id=item["id"]),
        server_event("conversation.item.added", previous_item_id=previous, item=item),
    ]


def transcription(new_id: str, transcript: str | None, missing: str) -> list[Event]:
    """The transcription events of a speech item (``missing``: why there is none)."""
    ids = {"item_id": new_id, "content_index": 0}
    prefix = "conversation.item.input_audio_transcription"
    if transcript is None:
        error = {
            "type": "transcription_error",
            "code": "unsupported",
            "message": missing,
            "param": None,
        }
        return [server_event(f"{prefix}.failed", **ids, error=error)]
    return [
        server_event(f"{prefix}.delta", **ids, delta=transcript),
        server_event(
            f"{prefix}.completed",
            **ids,
            transcript=transcript,
            usage={"type": "duration", "seconds": 0},
        ),
    ]


def edit(event: Any, conversation: Conversation, spoken_ms: dict[str, float]) -> Event | None:
    """A ``conversation.item.retrieve|delete|truncate`` done on the
    conversation, as the event that answers it (None for other events)."""
    if isinstance(event, ItemRetrieve):
        item = conversation.get(event.item_id, event.event_id)
        return server_event("conversation.item.retrieved", item=item)
    if isinstance(event, ItemDelete):
        conversation.delete(event.item_id, event.event_id)
        return server_event("conversation.item.deleted", item_id=event.item_id)
    if isinstance(event, ItemTruncate):
        spoken = spoken_ms.get(event.item_id, 0.0)
        conversation.truncate(
            event.item_id, event.content_index, event.audio_end_ms, spoken, event.event_id
        )
        return server_event(
            "conversation.item.truncated",
            item_id=event.item_id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )
    return None
