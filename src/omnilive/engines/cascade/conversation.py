"""A conversation's history, kept within the model's context.

The system prompt always stays; when the next prompt would not leave room for
the answer, whole exchanges are dropped from the oldest on. Fitting is
computed without changing anything, so speculative work (an answer started
before the user finished) can be discarded, and applied when the turn is
committed.

A small model that once repeats an earlier answer word for word copies it
for every question after (the packaged 135M model did from about the 18th
spoken turn: benchmarks/cascade_long_call), so an answer that opens as an
earlier one did lets the history go, and the next question is answered
afresh.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.llm import Message
from omnilive.engines.messages import HistoryTruncation
from omnilive.engines.truncation import tokens_to_drop

if TYPE_CHECKING:
    from omnilive.engines.cascade.stack import Notices

log = logging.getLogger(__name__)
AUTO = HistoryTruncation()
Counter = Callable[[list[Message]], int]
# An answer whose first ECHO_WORDS words are an earlier answer's is a repeat
# (shorter answers are not judged: "Yes, of course." may well come twice).
ECHO_WORDS = 8
_WORD = re.compile(r"[\w']+")


def _opening(text: str) -> tuple[str, ...] | None:
    words = _WORD.findall(text.lower())
    return tuple(words[:ECHO_WORDS]) if len(words) >= ECHO_WORDS else None


@dataclass(frozen=True)
class Fit:
    """How to make the next prompt fit: drop ``dropped`` oldest turns."""

    dropped: int
    messages: list[Message]
    tokens: int


class Conversation:
    """System prompt plus alternating user / assistant turns."""

    def __init__(self, system: str, keep: int = 0) -> None:
        self.system = system
        self.keep = keep  # the most earlier turns a prompt holds (0: what fits)
        self.turns: list[Message] = []
        self._saved: list[Message] = []

    def messages(self, *extra: Message) -> list[Message]:
        return [Message("system", self.system), *self.turns, *extra]

    def fit(
        self,
        count: Counter,
        budget: int,
        *extra: Message,
        truncation: HistoryTruncation = AUTO,
    ) -> Fit:
        """The fewest oldest turns to drop so the prompt with ``extra`` fits
        ``budget``, as ``truncation`` says (a client's limit and retention
        ratio; disabled: none leave, and a prompt past the budget is
        :class:`ContextFullError`).

        Turns go from the front until the history starts at a user turn again,
        so an answer is never kept without its question; beyond ``keep``
        turns the oldest go whatever the budget, unless truncation is disabled.
        """
        keep = self.keep if truncation.enabled else 0
        dropped = self._from_a_question(max(0, len(self.turns) - keep) if keep else 0)
        system = count([Message("system", self.system)])
        messages = self._prompt(dropped, extra)
        tokens = count(messages)
        target = tokens - tokens_to_drop(truncation, tokens - system, 0, budget - system)
        while tokens > target:
            if dropped >= len(self.turns):
                if tokens <= budget:  # past a retention target, within the context
                    break
                raise EngineError(
                    f"the prompt needs {tokens} tokens even without history; "
                    f"the context leaves {budget} for it"
                )
            dropped = self._from_a_question(dropped + 1)
            messages = self._prompt(dropped, extra)
            tokens = count(messages)
        return Fit(dropped, messages, tokens)

    def _prompt(self, dropped: int, extra: tuple[Message, ...]) -> list[Message]:
        return [Message("system", self.system), *self.turns[dropped:], *extra]

    def _from_a_question(self, dropped: int) -> int:
        """``dropped`` turns, or more: up to the next user turn (0 stays 0)."""
        while 0 < dropped < len(self.turns) and self.turns[dropped].role != "user":
            dropped += 1
        return dropped

    def commit(self, fit: Fit, *extra: Message) -> None:
        """Apply a :meth:`fit` and append the turns it was computed with."""
        del self.turns[: fit.dropped]
        self.turns.extend(extra)

    def add(self, role: str, text: str) -> None:
        opening = _opening(text) if role == "assistant" else None
        if opening is not None and any(
            _opening(turn.content) == opening for turn in self.turns if turn.role == "assistant"
        ):
            log.info("the answer repeats an earlier one: the conversation's history is let go")
            self.turns.clear()
            return
        self.turns.append(Message(role, text))

    def snapshot(self) -> None:
        self._saved = list(self.turns)

    def rollback(self) -> None:
        self.turns = list(self._saved)


class ConversationView:
    """What a session with a conversation shows of itself: the engine's
    notices (``warnings``) and the prompt's messages (``history``). Mixed into
    the half-duplex and duplex sessions, which set the three attributes."""

    _notices: Notices
    _lock: threading.Lock
    _conversation: Conversation

    @property
    def warnings(self) -> list[str]:
        return self._notices.items

    @property
    def history(self) -> list[Message]:
        """The prompt's messages as they stand: system prompt first, then the turns."""
        with self._lock:
            return self._conversation.messages()
