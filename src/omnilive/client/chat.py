"""Turn-based chat (``WS /ws/chat``): one request, one streamed answer.

::

    chat = Chat(url)
    reply = await chat.ask("What is the capital of France?")
    print(reply.text)
    write_wav("answer.wav", reply.audio)

A request is stateless: the conversation so far travels with each one
(``messages``, built with :func:`user`, :func:`system`, :func:`assistant`
from text, 16 kHz audio arrays, :func:`image` and :func:`video` items).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self, Unpack

import numpy as np

from omnilive.client.audio import INPUT_RATE, encode_pcm
from omnilive.client.connection import DEFAULT_URL, ws_url
from omnilive.client.events import ChatDone, Chunk, PrefillDone
from omnilive.client.machine import ModeRules
from omnilive.client.session import (
    ConnectOptions,
    Session,
    Voice,
    build,
    check_options,
    voice_fields,
)
from omnilive.protocol.chat import (
    AudioItem,
    ChatRequest,
    ContentItem,
    GenerationConfig,
    ImageItem,
    Message,
    TextItem,
    VideoItem,
)

Content = str | np.ndarray | TextItem | ImageItem | AudioItem | VideoItem
Messages = str | Sequence[Message | Mapping[str, Any]]


def image(data: bytes) -> ImageItem:
    """An image item (JPEG or PNG bytes)."""
    return ImageItem(type="image", data=base64.b64encode(data).decode("ascii"))


def video(data: bytes, stack_frames: int = 1) -> VideoItem:
    """A video item (a video file's bytes; the server extracts frames and audio)."""
    encoded = base64.b64encode(data).decode("ascii")
    return VideoItem(type="video", data=encoded, stack_frames=stack_frames)


def audio(samples: np.ndarray, rate: int = INPUT_RATE) -> AudioItem:
    """An audio item (mono float32 at ``rate``; 16 kHz is what models hear)."""
    return AudioItem(type="audio", data=encode_pcm(samples), sample_rate=rate)


def _item(part: Content) -> ContentItem:
    if isinstance(part, str):
        return TextItem(type="text", text=part)
    if isinstance(part, np.ndarray):
        return audio(part)
    return part


def message(role: Literal["system", "user", "assistant"], *content: Content) -> Message:
    """A message from text, audio arrays and items; one text stays a plain string."""
    if len(content) == 1 and isinstance(content[0], str):
        return Message(role=role, content=content[0])
    return Message(role=role, content=[_item(part) for part in content])


def user(*content: Content) -> Message:
    return message("user", *content)


def system(*content: Content) -> Message:
    return message("system", *content)


def assistant(*content: Content) -> Message:
    return message("assistant", *content)


def as_messages(messages: Messages, system_prompt: str | None = None) -> list[Message]:
    """A question (a string) or a conversation, with the system prompt first."""
    if isinstance(messages, str):
        found = [user(messages)]
    else:
        found = [m if isinstance(m, Message) else Message.model_validate(m) for m in messages]
    return [system(system_prompt), *found] if system_prompt else found


def chat_request(
    messages: Messages,
    *,
    system_prompt: str | None = None,
    streaming: bool | None = None,
    tts: bool | None = None,
    voice: Voice = None,
    tts_mode: str | None = None,
    language: str | None = None,
    generation: Mapping[str, Any] | GenerationConfig | None = None,
    max_slice_nums: int | None = None,
    omni_mode: bool | None = None,
    enable_thinking: bool | None = None,
    recording: bool | None = None,
) -> dict[str, Any]:
    """A chat request as the wire takes it, checked by the server's own model."""
    tts_fields = {
        "enabled": tts,
        "mode": tts_mode,
        "language": language,
        **voice_fields(voice, "ref_audio_data", "ref_audio_id"),
    }
    tts_given = {k: v for k, v in tts_fields.items() if v is not None}
    conversation = as_messages(messages, system_prompt)
    return build(
        ChatRequest,
        messages=[m.model_dump(mode="json", exclude_unset=True) for m in conversation],
        streaming=streaming,
        tts=tts_given or None,
        generation=generation,
        image={"max_slice_nums": max_slice_nums} if max_slice_nums else None,
        omni_mode=omni_mode,
        enable_thinking=enable_thinking,
        recording=recording,
    )


def joined_audio(pieces: list[np.ndarray]) -> np.ndarray | None:
    return np.concatenate(pieces) if pieces else None


class ChatAnswer(Session):
    """One chat request on its own socket. Events: the queue's (only when it
    waits), :class:`PrefillDone`, :class:`Chunk` (streaming), and
    :class:`ChatDone`; an error ends it, raised as its typed exception."""

    def __init__(
        self, url: str, request: dict[str, Any], **options: Unpack[ConnectOptions]
    ) -> None:
        self._request = request
        super().__init__(url, **options)

    def _rules(self) -> ModeRules:
        return ModeRules(ready=(PrefillDone,), ends=(ChatDone,), stop=None, configure_on_open=True)

    def _configure_message(self) -> Mapping[str, Any]:
        return self._request

    def _socket_url(self) -> str:
        return ws_url(self.url, "/ws/chat")

    async def __aenter__(self) -> Self:
        """Open and send the request; the events tell the rest (queue included)."""
        return await self.open()

    async def reply(self) -> ChatDone:
        """Read the answer to its end: ``done`` with the streamed audio joined in."""
        pieces: list[np.ndarray] = []
        async for event in self:
            if isinstance(event, Chunk) and event.audio is not None:
                pieces.append(event.audio)
            elif isinstance(event, ChatDone):
                if event.audio is None and pieces:
                    return dataclasses.replace(event, audio=joined_audio(pieces))
                return event
        raise AssertionError("unreachable: a chat ends with done or raises")


class Chat:
    """A chat client for one server. Each :meth:`ask` or :meth:`request` is a
    request of its own (the server keeps nothing between them)."""

    def __init__(self, url: str = DEFAULT_URL, **options: Unpack[ConnectOptions]) -> None:
        check_options(options)
        self.url = url
        self._options = options

    def request(self, messages: Messages, **options: Any) -> ChatAnswer:
        """``async with chat.request(...) as answer: async for event in answer``;
        ``options`` are :func:`chat_request`'s."""
        return ChatAnswer(self.url, chat_request(messages, **options), **self._options)

    async def ask(self, messages: Messages, **options: Any) -> ChatDone:
        """The whole answer: text, and (when speech is on) its audio at 24 kHz."""
        async with self.request(messages, **options) as answer:
            return await answer.reply()
