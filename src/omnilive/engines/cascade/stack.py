"""The three loaded models and what every view of the cascade shares."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from omnilive.engines.cascade.answer import FIRST_MAX_WORDS, AnswerStream
from omnilive.engines.cascade.asr import WhisperASR
from omnilive.engines.cascade.conversation import Conversation
from omnilive.engines.cascade.llm import LlamaChat
from omnilive.engines.cascade.remote_llm import RemoteChat
from omnilive.engines.cascade.tts import Speech, SpokenVoice
from omnilive.engines.cascade.utterance import TurnJudging
from omnilive.engines.messages import GenerationOptions, Part, TextPart, Voice

log = logging.getLogger("omnilive.engines.cascade")

DEFAULT_SYSTEM_PROMPT = "You are a friendly, helpful voice assistant."
# A 135M model rambles; spoken answers should be short anyway.
SPOKEN_STYLE = "Answer in one or two short sentences of plain spoken English."
SPOKEN_MAX_TOKENS = 128


def spoken_system_prompt(text: str) -> str:
    """The session's own prompt (or ours) plus the instruction to answer briefly."""
    return f"{text.strip() or DEFAULT_SYSTEM_PROMPT}\n{SPOKEN_STYLE}"


def spoken_conversation(system_prompt: str, keep: int = 0) -> Conversation:
    """A voice session's conversation before its first turn, keeping at
    most ``keep`` earlier messages in a prompt (0: what the context takes)."""
    return Conversation(spoken_system_prompt(system_prompt), keep)


def text_of(parts: list[Part] | tuple[Part, ...]) -> str:
    return " ".join(p.text.strip() for p in parts if isinstance(p, TextPart) and p.text.strip())


class Notices:
    """Limitations a session hit but worked around, for the client to be told.

    Each is logged once and kept in :attr:`items` (exposed by the sessions as
    ``warnings``): the engine answers, but never silently drops a request.
    """

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        if message not in self.items:
            self.items.append(message)
            log.warning("cascade: %s", message)

    def extend(self, messages: tuple[str, ...] | list[str]) -> None:
        for message in messages:
            self.add(message)


@dataclass
class ModelStack:
    """Whisper, SmolLM2 and the voices, loaded once and shared by all sessions."""

    asr: WhisperASR
    llm: LlamaChat | RemoteChat
    tts: Speech
    turn_judging: TurnJudging | None = None  # the duplex loop's end-of-turn model, if on
    history_messages: int = 0  # cascade.llm.history_messages: 0 keeps what fits

    def conversation(self, system_prompt: str) -> Conversation:
        """A voice session's conversation, keeping this stack's share of history."""
        return spoken_conversation(system_prompt, self.history_messages)

    def voice(self, voice: Voice | None, notices: Notices) -> SpokenVoice:
        spoken = self.tts.resolve_voice(voice)
        notices.extend(spoken.warnings)
        return spoken

    def answer(
        self,
        prompt: list[int],
        options: GenerationOptions,
        max_tokens: int,
        voice: str | None,
        cancel: threading.Event | None = None,
        first_words: int = FIRST_MAX_WORDS,
    ) -> AnswerStream:
        return AnswerStream(
            self.llm, self.tts, prompt, options, max_tokens, voice, cancel, first_words
        )

    def spoken_budget(self, options: GenerationOptions) -> int:
        """Tokens an answer spoken aloud may take (the request's cap, bounded)."""
        return max(1, min(options.max_new_tokens, SPOKEN_MAX_TOKENS))
