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
    """System prompt plus alternating user / assistant turns.

    Each turn stands for one or more of the session's turns as the engine
    seam counts them (:attr:`~omnilive.engines.base.HalfDuplexBasics.history_dropped`):
    a message with nothing to keep (untranscribed speech, an answer that
    said nothing) joins the turn before it, so that ``dropped`` counts
    exactly the client's messages that left from the front."""

    def __init__(self, system: str, keep: int = 0) -> None:
        self.system = system
        self.keep = keep  # the most earlier turns a prompt holds (0: what fits)
        self.turns: list[Message] = []
        self.dropped = 0  # the session's turns let go from the front
        self._spans: list[int] = []  # the session's turns each of ``turns`` stands for
        self._saved: tuple[list[Message], list[int], int] = ([], [], 0)

    def spans(self) -> list[int]:
        """Per turn, how many of the session's turns it stands for (the
        turns change only through this class's methods, which keep both)."""
        return list(self._spans)

    def set_turns(self, turns: list[Message | None]) -> None:
        """The history becomes ``turns``; None for a message with nothing to
        keep, which joins the turn before it (before the first: let go)."""
        kept: list[Message] = []
        spans: list[int] = []
        self.dropped = 0
        for turn in turns:
            if turn is not None:
                kept.append(turn)
                spans.append(1)
            elif spans:
                spans[-1] += 1
            else:
                self.dropped += 1
        self.turns, self._spans = kept, spans

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
        spans = self.spans()
        self.dropped += sum(spans[: fit.dropped])
        del self.turns[: fit.dropped]
        self.turns.extend(extra)
        self._spans = spans[fit.dropped :] + [1] * len(extra)

    def add(self, role: str, text: str) -> None:
        """A turn at the end; an answer with no words joins the turn before it."""
        spans = self.spans()
        opening = _opening(text) if role == "assistant" else None
        if opening is not None and any(
            _opening(turn.content) == opening for turn in self.turns if turn.role == "assistant"
        ):
            log.info("the answer repeats an earlier one: the conversation's history is let go")
            self.dropped += sum(spans) + 1
            self.turns.clear()
            self._spans = []
            return
        if not text.strip():
            self._absorb(spans)
            return
        self.turns.append(Message(role, text))
        self._spans = [*spans, 1]

    def cut_answer(self, text: str) -> bool:
        """The last turn, an answer, becomes ``text`` (empty: it leaves, and
        joins the turn before it); False when the last turn is no answer."""
        if not self.turns or self.turns[-1].role != "assistant":
            return False
        spans = self.spans()
        if text.strip():
            self.turns[-1] = Message("assistant", text.strip())
            return True
        self.turns.pop()
        self._absorb(spans[:-1], spans[-1])
        return True

    def _absorb(self, spans: list[int], count: int = 1) -> None:
        if spans:
            spans[-1] += count
        else:
            self.dropped += count
        self._spans = spans

    def snapshot(self) -> None:
        self._saved = (list(self.turns), self.spans(), self.dropped)

    def rollback(self) -> None:
        turns, spans, self.dropped = self._saved
        self.turns, self._spans = list(turns), list(spans)


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
