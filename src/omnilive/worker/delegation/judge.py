"""When a Live session hands the user's request to its backend.

OpenAI's Live model decides that itself; MiniCPM-o's duplex mode and the
cascade were not trained to. omnilive judges each of the user's turns once
it is transcribed, against what the session says may be delegated: the
backend's function tools (``delegation.responses.tools``) and the lines of
the instructions that speak of delegating ("delegate weather questions",
"hand off bookings to the backend").

- :class:`CueJudge` (``live.judge.mode = "cues"``, the default): the turn is
  delegated when it shares a content word with one of those cues (a tool's
  name and description, a delegation line's words), each cue widened by its
  topic's words ("weather" by "rain", "sunny") and a heard word let be
  Whisper's sound-alike of a cue word ("train" for "rain"): ``topics.py``;
  no model, a fraction of a millisecond, and the same answer every time.
- :class:`ModelJudge` (``"model"``): a text model on any OpenAI-compatible
  server is asked yes or no, with the instructions and the tools.

``benchmarks/live_dialect.py`` measures both on requests that need the
backend and requests that do not.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.remote_llm import RemoteChat
from omnilive.engines.messages import GenerationOptions
from omnilive.live_settings import JudgeSettings
from omnilive.worker.delegation.topics import families, sounds_like, widened

# Words in a line of the instructions that make it a delegation line.
_DELEGATION_MARKS = ("delegat", "hand off", "handoff", "hand over", "backend", "escalat", "look up")
_WORD = re.compile(r"[a-z0-9]+")
# Words that say nothing of a request's topic: function words, and the
# words instructions use to speak of delegating itself.
_STOPWORDS = frozenset(
    """a about after all also an and any anything are as ask asked asks at be been before by
    call can could current did do does for from get give go has have help how i if in info
    information into is it its just know let like look me my need new no not now of on one
    or our out please question questions request requests right say see should so some
    something tell than that the their them then there these they this to up us use user
    users want was we what when where which who why will with would you your delegate
    delegated delegation backend tool tools function hand off over handle send escalate
    always never only anyone answer answers reply""".split()  # noqa: SIM905 - a word list reads as prose
)


def stem(word: str) -> str:
    """``word`` crudely stemmed (plurals, -ing, -ed), so that a word's forms
    meet: a final e goes too (share, shares, shared, sharing: shar), as do a
    plural's -ies (city, cities) and no -s of -ss (class, classes)."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def words(text: str) -> set[str]:
    """The content words of ``text``, lower case, crudely stemmed (:func:`stem`)."""
    found = set()
    for word in _WORD.findall(text.lower().replace("_", " ")):
        if word in _STOPWORDS or len(word) < 3:
            continue
        found.add(stem(word))
    return found


@dataclass(frozen=True)
class Delegable:
    """What a session says may be delegated."""

    instructions: str = ""
    tools: tuple[dict[str, Any], ...] = ()  # function tools: name, description

    def cue_lines(self) -> list[str]:
        """The tools' names and descriptions, and the instructions' delegation lines."""
        lines = [f"{t.get('name', '')} {t.get('description') or ''}" for t in self.tools]
        for sentence in re.split(r"[.\n;!?]+", self.instructions):
            if any(mark in sentence.lower() for mark in _DELEGATION_MARKS):
                lines.append(sentence)
        return lines


@dataclass(frozen=True)
class Verdict:
    delegate: bool
    why: str = ""


class Judge(Protocol):
    async def judge(self, turn: str, delegable: Delegable) -> Verdict: ...


@dataclass
class CueJudge:
    """See the module: a shared content word delegates."""

    topic_families: list[frozenset[str]] = field(default_factory=lambda: families(stem))

    def judge_now(self, turn: str, delegable: Delegable) -> Verdict:
        heard = words(turn)
        for line in delegable.cue_lines():
            cues = widened(words(line), self.topic_families)
            shared = sorted(w for w in heard if any(sounds_like(w, cue) for cue in cues))
            if shared:
                return Verdict(True, f"shares {shared} with {line.strip()[:80]!r}")
        return Verdict(False, "no cue")

    async def judge(self, turn: str, delegable: Delegable) -> Verdict:
        return self.judge_now(turn, delegable)


@dataclass
class ModelJudge:
    """A text model answers yes or no (on its own thread: the server's call blocks)."""

    chat: RemoteChat
    max_tokens: int = 3
    options: GenerationOptions = field(
        default_factory=lambda: GenerationOptions(max_new_tokens=3, do_sample=False)
    )

    def prompt(self, turn: str, delegable: Delegable) -> list[Message]:
        tools = "\n".join(
            f"- {t.get('name')}: {t.get('description') or ''}" for t in delegable.tools
        )
        system = (
            "You decide whether a voice assistant must hand the user's request to a backend "
            "that can do what the assistant cannot.\n"
            f"The assistant's instructions:\n{delegable.instructions or '(none)'}\n"
            f"The backend's tools:\n{tools or '(none)'}\n"
            "Answer with one word: yes or no."
        )
        question = f'The user said: "{turn}"\nDoes this request need the backend?'
        return [Message("system", system), Message("user", question)]

    def judge_now(self, turn: str, delegable: Delegable) -> Verdict:
        prompt = self.chat.tokens(self.prompt(turn, delegable))
        answer = "".join(
            p for p in self.chat.stream(prompt, self.options, self.max_tokens) if isinstance(p, str)
        )
        return Verdict(answer.strip().lower().startswith("yes"), f"the model said {answer!r}")

    async def judge(self, turn: str, delegable: Delegable) -> Verdict:
        return await asyncio.to_thread(self.judge_now, turn, delegable)


@dataclass
class NeverJudge:
    async def judge(self, turn: str, delegable: Delegable) -> Verdict:
        return Verdict(False, "the judge is off")


def judge_of(settings: JudgeSettings) -> Judge:
    """The judge ``settings`` name (a model judge needs its server's url)."""
    if settings.mode == "off":
        return NeverJudge()
    if settings.mode == "model":
        if settings.server.url is None:
            raise ValueError("live.judge.mode = model needs live.judge.server.url")
        return ModelJudge(RemoteChat.from_settings(settings.server), settings.max_tokens)
    return CueJudge()


def tools_of(tools: Iterable[dict[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    """The function tools of a list of Responses tools."""
    return tuple(t for t in tools or () if t.get("type") == "function")
