"""The rule of :class:`~omnilive.engines.messages.HistoryTruncation`, for
every engine whose conversation outgrows its context (the cascade's prompt,
MiniCPM-o's slot): how much of the history must leave, in the engine's own
tokens, or that nothing may."""

from __future__ import annotations

from omnilive.engines.base import EngineError
from omnilive.engines.messages import HistoryTruncation


class ContextFullError(EngineError):
    """The conversation has no room left and may not let its oldest turns
    go (truncation disabled): the client deletes items to make room."""


def tokens_to_drop(policy: HistoryTruncation, history: int, incoming: int, room: int) -> int:
    """How many of the ``history`` tokens (what follows the instructions)
    must leave before ``incoming`` ones join them, where the context leaves
    ``room`` for the history (the answer's share taken out); 0 when they
    fit. The engine drops whole turns, so it may let a little more go."""
    limit = room if policy.limit_tokens is None else min(policy.limit_tokens, room)
    total = history + incoming
    if total <= limit:
        return 0
    if not policy.enabled:
        raise ContextFullError(
            f"the conversation needs {total} tokens after its instructions and has room "
            f"for {limit}; its truncation is disabled, so nothing leaves: delete items "
            "to make room"
        )
    target = limit if policy.retention_ratio is None else int(policy.retention_ratio * limit)
    return total - target
