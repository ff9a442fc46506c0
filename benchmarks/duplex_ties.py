"""Ties in the duplex equality harness (benchmarks/duplex_equality.py): the
batched run follows the reference's path where bf16 rounding leaves two tokens
within a hair of each other, and counts each such tie."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.duplex_equality import UnitTrace


class TieFollower:
    """Keeps the batched run on the reference's path through ties.

    bf16 forwards batched differently round differently; two tokens within
    ``tie`` of each other may then be chosen the other way, after which the
    two contexts (and every later figure) differ. Where the batched engine's
    choice differs from the reference's by no more than ``tie`` in the logits
    it chose from, it takes the reference's (counted as a tie); a larger
    difference is left alone and shows up as a mismatch."""

    def __init__(self, reference: list[UnitTrace], tie: float, session: int) -> None:
        self.session = session
        # Per unit (a flat count of choices drifts for good after any unit
        # where the two made a different number of calls).
        self.text_units = [list(unit.chosen) for unit in reference]
        self.speech_units = [[t for c in unit.speech_chunks for t in c] for unit in reference]
        self.tie = tie
        self.unit = 0
        self.text_at = 0
        self.ties: list[dict[str, Any]] = []

    def start(self, unit: int) -> None:
        """The session's next choices are unit ``unit``'s."""
        self.unit, self.text_at = unit, 0

    def text_choice(self, token: int, logits: Any, history: list[int]) -> int:
        k, self.text_at = self.text_at, self.text_at + 1
        text = self.text_units[self.unit] if self.unit < len(self.text_units) else []
        if k >= len(text) or token == text[k] or logits is None:
            return token
        expected = text[k]
        if not self._tied(token, expected, logits, kind="text", choice=k):
            return token
        if history and history[-1] == token:
            history[-1] = expected
        return expected

    def speech_choice(self, token: int, logits: Any, previous: list[int]) -> int:
        t = len(previous)
        speech = self.speech_units[self.unit] if self.unit < len(self.speech_units) else []
        if t >= len(speech) or token == speech[t]:
            return token
        expected = speech[t]
        return expected if self._tied(token, expected, logits, kind="speech", index=t) else token

    def _tied(self, token: int, expected: int, logits: Any, kind: str, **where: int) -> bool:
        """Whether ``token`` and the reference's ``expected`` are within
        ``tie`` in ``logits``; a tie is counted, with where it was."""
        gap = float(logits[token]) - float(logits[expected])
        if abs(gap) > self.tie:
            return False
        self.ties.append({"kind": kind, "unit": self.unit, **where, "gap": gap})
        return True


def follow_ties(followers: dict[int, TieFollower]) -> Any:
    """Wrap the engine's choice functions so each session (found by its
    generator) follows the reference through ties; returns the undo."""
    from omnilive.engines.minicpmo.sessions.duplex import session as duplex_slots
    from omnilive.engines.minicpmo.sessions.duplex import speech_choice, unit_rules

    text, speech = unit_rules.choose_tokens, speech_choice.choose_speech_tokens

    def choose_text(rows):
        before = [len(choice.seen) if choice.seen is not None else 0 for _, choice in rows]
        tokens = text(rows)
        followed = []
        for (_, choice), seen_before, token in zip(rows, before, tokens, strict=True):
            follower = followers.get(id(choice.generator))
            if follower is None:
                followed.append(token)
                continue
            seen = choice.seen
            processed = seen[-1] if seen is not None and len(seen) > seen_before else None
            followed.append(follower.text_choice(token, processed, choice.history))
        return followed

    def choose_speech(rows):
        tokens = speech(rows)
        followed = []
        for (_, pick), token in zip(rows, tokens, strict=True):
            follower = followers.get(id(pick.uniforms.generator))
            if follower is None or not pick.seen:
                followed.append(token)
            else:
                followed.append(follower.speech_choice(token, pick.seen[-1], pick.previous))
        return followed

    # A unit's first token is chosen in the session's module, the others by
    # the picks of unit_rules; the speech tokens by those of speech_choice.
    duplex_slots.choose_tokens = unit_rules.choose_tokens = choose_text
    speech_choice.choose_speech_tokens = choose_speech

    def undo() -> None:
        duplex_slots.choose_tokens = unit_rules.choose_tokens = text
        speech_choice.choose_speech_tokens = speech

    return undo
