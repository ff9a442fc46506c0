"""Resumable sessions, the part without I/O: a session's numbered replay
log, the table of resume tokens, and how a resuming connection asks.

A streaming session's server events are numbered 1, 2, 3, ... in the order
the gateway sends them (its own and its worker's alike). The first one
carries the session's resume token. A client whose connection dropped opens
a new one with the token and the last number it received; the gateway
replays the rest from the log (``docs/resume.md``).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from omnilive.protocol.common import ErrorCode, ProtocolError

# How a resuming connection names its token and the last event it received:
# query parameters, or (for browsers, keeping the token out of URLs and logs)
# subprotocols offered next to ``omnilive`` / ``realtime``.
TOKEN_PARAM = "resume_token"
LAST_SEQ_PARAM = "last_seq"
SEQ_PARAM = "seq"  # ``seq=1``: stamp every event with its number
TOKEN_SUBPROTOCOL = "omnilive.resume."
LAST_SEQ_SUBPROTOCOL = "omnilive.last_seq."
RESUME_SUBPROTOCOLS = (TOKEN_SUBPROTOCOL, LAST_SEQ_SUBPROTOCOL)
RESUMED_TYPE = "session.resumed"
MAX_TOKEN_CHARS = 128


@dataclass(frozen=True)
class ResumeRequest:
    """A connection's ask to continue a suspended session."""

    token: str
    last_seq: int  # the last event the client received (0: none)


def _offered(subprotocols: tuple[str, ...], prefix: str) -> str | None:
    return next((p[len(prefix) :] for p in subprotocols if p.startswith(prefix)), None)


def resume_request_of(
    query: Mapping[str, str], subprotocols: tuple[str, ...]
) -> ResumeRequest | None:
    """The resume a connection asks for, None if it opens a new session.
    A malformed one is a :class:`ProtocolError` (``resume_refused``)."""
    token = (
        query[TOKEN_PARAM] if TOKEN_PARAM in query else _offered(subprotocols, TOKEN_SUBPROTOCOL)
    )
    if token is None:
        return None
    last = query.get(LAST_SEQ_PARAM) or _offered(subprotocols, LAST_SEQ_SUBPROTOCOL) or "0"
    if (
        not token
        or len(token) > MAX_TOKEN_CHARS
        or len(last) > 12
        or not (last.isascii() and last.isdigit())
    ):
        raise ProtocolError(ErrorCode.RESUME_REFUSED, "malformed resume token or last_seq")
    return ResumeRequest(token, int(last))


def kept_token(scope: Mapping[str, object]) -> dict[str, str]:
    """The resume token the auth middleware took out of a request's query
    string (to keep it out of access logs), as a query parameter again."""
    state = scope.get("state")
    token = state.get(TOKEN_PARAM) if isinstance(state, dict) else None
    return {TOKEN_PARAM: token} if isinstance(token, str) else {}


def asks_resume(query: Mapping[str, str], subprotocols: tuple[str, ...]) -> bool:
    """Whether a connection presents a resume token (valid or not): it takes
    no new session place, the session it resumes holds one already."""
    return TOKEN_PARAM in query or _offered(subprotocols, TOKEN_SUBPROTOCOL) is not None


def stamped(text: str, fields: Mapping[str, object]) -> str:
    """``text`` (a JSON object) with ``fields`` first, without parsing it: the
    gateway never decodes a worker's media, and this costs one copy."""
    if not fields or not text.startswith("{"):
        return text
    head = json.dumps(dict(fields), separators=(",", ":"))[:-1]
    rest = text[1:].lstrip()
    return head + ("}" if rest.startswith("}") else "," + rest)


class ReplayLog:
    """A session's server events, numbered, the newest kept for replay.

    Bounded by count and bytes; overflow drops the oldest (counted in
    ``dropped``). A client asking for events older than the oldest kept is
    told how many it lost (:meth:`missing`)."""

    def __init__(self, max_events: int, max_bytes: int, numbered: bool) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.numbered = numbered  # stamp ``seq`` into each event
        self.first_fields: dict[str, object] = {}  # added to event 1 (the resume token)
        self.last_seq = 0
        self.dropped = 0
        self._events: deque[tuple[int, str]] = deque()
        self._bytes = 0

    def append(self, text: str) -> int:
        self.last_seq += 1
        seq = self.last_seq
        fields: dict[str, object] = {"seq": seq} if self.numbered else {}
        if seq == 1:
            fields.update(self.first_fields)
        text = stamped(text, fields)
        self._events.append((seq, text))
        self._bytes += len(text)
        while len(self._events) > 1 and (
            len(self._events) > self.max_events or self._bytes > self.max_bytes
        ):
            _, old = self._events.popleft()
            self._bytes -= len(old)
            self.dropped += 1
        return seq

    @property
    def first_kept(self) -> int:
        return self._events[0][0] if self._events else self.last_seq + 1

    def after(self, seq: int) -> list[tuple[int, str]]:
        """The kept events numbered above ``seq``, in order."""
        if seq >= self.last_seq:
            return []
        start = max(0, seq + 1 - self.first_kept)
        return [self._events[i] for i in range(start, len(self._events))]

    def missing(self, seq: int) -> int:
        """Events after ``seq`` that are no longer kept."""
        return max(0, self.first_kept - seq - 1)

    def bytes_after(self, seq: int) -> int:
        return sum(len(text) for s, text in self._events if s > seq)


class ResumeRefused(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.RESUME_REFUSED, message)


H = TypeVar("H")


@dataclass
class _Entry(Generic[H]):
    handle: H
    owner: str | None
    route: str
    open: bool = False  # resumable now (the session has its worker)


class ResumeTable(Generic[H]):
    """Resume tokens of live sessions, one per session for its whole life.
    Only digests are kept. A token is not used up by a resume: a client
    whose connection drops again before it read ``session.resumed`` must
    still be able to come back. Two connections with one token do not share
    the session: the newer takes it over and the older is let go
    (``client_channel.ClientChannel.hand_over``)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry[H]] = {}
        self._digest_of: dict[int, str] = {}  # id(handle) -> its digest

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def mint(self, handle: H, owner: str | None, route: str) -> str:
        """The token of ``handle``, a session on ``route`` opened by ``owner``."""
        self._pop(handle)
        token = secrets.token_urlsafe(24)
        digest = self._digest(token)
        self._entries[digest] = _Entry(handle, owner, route)
        self._digest_of[id(handle)] = digest
        return token

    def set_open(self, handle: H, open_: bool) -> None:
        digest = self._digest_of.get(id(handle))
        if digest is not None:
            self._entries[digest].open = open_

    def is_open(self, handle: H) -> bool:
        digest = self._digest_of.get(id(handle))
        return digest is not None and self._entries[digest].open

    def claim(self, token: str, owner: str | None, route: str) -> H:
        """The session ``token`` resumes; raises :class:`ResumeRefused` with
        the reason otherwise."""
        entry = self._entries.get(self._digest(token))
        if entry is None:
            raise ResumeRefused("unknown or expired resume token")
        if entry.owner != owner:
            raise ResumeRefused("this resume token belongs to another API key")
        if entry.route != route:
            raise ResumeRefused(f"this resume token is for a {entry.route} session")
        if not entry.open:
            raise ResumeRefused("the session cannot be resumed now (queued or ending)")
        return entry.handle

    def forget(self, handle: H) -> None:
        self._pop(handle)

    def _pop(self, handle: H) -> _Entry[H] | None:
        digest = self._digest_of.pop(id(handle), None)
        return self._entries.pop(digest, None) if digest is not None else None

    def __len__(self) -> int:
        return len(self._entries)
