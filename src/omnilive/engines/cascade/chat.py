"""Turn-based chat on the cascade: transcribe audio, then stream a spoken answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.answer import AnswerStream
from omnilive.engines.cascade.asr import Transcript
from omnilive.engines.cascade.conversation import Conversation
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.stack import DEFAULT_SYSTEM_PROMPT, ModelStack, Notices, text_of
from omnilive.engines.messages import (
    AudioPart,
    ChatMessage,
    ChatOptions,
    Modality,
    TextAudioChunk,
    TextPart,
    modalities_of,
)
from omnilive.engines.sync_views import SyncChatSession

ROLES = ("system", "user", "assistant")
ANSWER_ROOM = 64  # the least context left for an answer, whatever max_new_tokens says


class CascadeChat(SyncChatSession):
    """One chat request: :meth:`prefill` builds the prompt, :meth:`generate` answers.

    ``prompt`` (the messages given to the LLM, transcripts included),
    ``transcripts`` and ``warnings`` stay readable after the request.
    """

    def __init__(self, stack: ModelStack, require: Callable[[set[Modality]], None]) -> None:
        self._stack = stack
        self._require = require
        self._notices = Notices()
        self.prompt: list[Message] = []
        self.transcripts: list[Transcript] = []
        self._tokens: list[int] | None = None
        self._options = ChatOptions()
        self._voice: str | None = None
        self._answer: AnswerStream | None = None

    @property
    def warnings(self) -> list[str]:
        return self._notices.items

    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        self._require(modalities_of(messages))
        spoken = self._stack.voice(options.voice, self._notices)
        self._voice = spoken.espeak if options.tts_enabled else None
        self._options = options
        system: list[str] = []
        turns: list[Message] = []
        for message in messages:
            if message.role == "system":
                system.append(self._system_text(message))
            else:
                role = message.role if message.role in ROLES else "user"
                turns.append(Message(role, self._content(message, spoken.espeak)))
        if not turns:
            raise EngineError("a chat request needs a user message")
        llm = self._stack.llm
        max_tokens = self._max_tokens()
        conversation = Conversation(" ".join(t for t in system if t) or DEFAULT_SYSTEM_PROMPT)
        conversation.set_turns(list(turns[:-1]))
        fit = conversation.fit(llm.count, llm.n_ctx - max_tokens, turns[-1])
        if fit.dropped:
            self._notices.add(f"the {fit.dropped} oldest messages did not fit the context")
        self.prompt = fit.messages
        self._tokens = llm.tokens(fit.messages)
        return len(self._tokens)

    def generate(self) -> Iterator[TextAudioChunk]:
        if self._tokens is None:
            raise EngineError("generate before prefill")
        self._answer = self._stack.answer(
            self._tokens, self._options.generation, self._max_tokens(), self._voice
        )
        yield from self._answer

    def close(self) -> None:
        if self._answer is not None:
            self._answer.close()

    def _max_tokens(self) -> int:
        cap = self._stack.llm.n_ctx - ANSWER_ROOM
        return max(1, min(self._options.generation.max_new_tokens, cap))

    def _system_text(self, message: ChatMessage) -> str:
        if any(isinstance(p, AudioPart) for p in message.parts):
            # Clients put the voice to imitate in the system message.
            self._notices.add(
                "voice cloning is not available on the cascade engine: "
                "the system message's reference audio was not used"
            )
        return text_of(message.parts)

    def _content(self, message: ChatMessage, language: str) -> str:
        pieces: list[str] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                pieces.append(part.text.strip())
            elif isinstance(part, AudioPart):
                heard = self._stack.asr.transcribe(part.samples, language)
                self.transcripts.append(heard)
                if not heard.text:
                    self._notices.add("no speech was recognised in an audio part")
                pieces.append(heard.text)
        return " ".join(p for p in pieces if p)
