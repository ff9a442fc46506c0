"""The rules of one half-duplex session on the worker, without I/O.

WAITING_PREPARE → PREPARING → LISTENING ⇄ ANSWERING → ENDED. The VAD
hears the end of the user's speech (the runner says so with
:meth:`HalfDuplexMachine.speech_ended`); while the model answers, audio is not
heard (the client should be silent then: echo) unless the client asked for
barge-in, and the inactivity timeout does not run. As in every streaming
session, ``stop`` ends it in any phase and messages sent during a prepare wait
for it.
"""

from __future__ import annotations

import math
from enum import StrEnum

from omnilive.worker.machines.session import Phases, SessionMachine


class HalfDuplexPhase(StrEnum):
    WAITING_PREPARE = "waiting_prepare"
    PREPARING = "preparing"
    LISTENING = "listening"  # the VAD hears the user
    ANSWERING = "answering"  # the model answers a turn
    ENDED = "ended"


HALF_DUPLEX_PHASES = Phases(
    HalfDuplexPhase.WAITING_PREPARE,
    HalfDuplexPhase.PREPARING,
    HalfDuplexPhase.LISTENING,
    HalfDuplexPhase.ENDED,
)


class HalfDuplexMachine(SessionMachine[HalfDuplexPhase]):
    phases = HALF_DUPLEX_PHASES

    def __init__(self, first_message_s: float, now: float) -> None:
        super().__init__(first_message_s, now)
        self.timeout_s = math.inf  # set by the prepare
        self.barge_in = False
        self.last_activity = now

    def prepared_with(self, timeout_s: float, now: float, barge_in: bool = False) -> list:
        """The session is prepared with its inactivity timeout (and whether
        speech may interrupt an answer); returns held messages."""
        held = self.prepared(now)
        self.timeout_s = timeout_s
        self.barge_in = barge_in
        self.last_activity = now
        return held

    def audio(self, now: float) -> bool:
        """A chunk came: whether the VAD hears it (while answering, only
        when the client asked for barge-in)."""
        self.require_prepared("audio_chunk")
        self.last_activity = now
        listening = self.phase is HalfDuplexPhase.LISTENING
        return listening or (self.barge_in and self.phase is HalfDuplexPhase.ANSWERING)

    def speech_ended(self) -> None:
        """The VAD heard the user stop: the model answers."""
        self.expect(HalfDuplexPhase.LISTENING, "end of speech")
        self.phase = HalfDuplexPhase.ANSWERING

    def answered(self, now: float) -> None:
        """The turn is over (done, failed or cut short): listening again."""
        if self.phase is HalfDuplexPhase.ENDED:
            return
        self.expect(HalfDuplexPhase.ANSWERING, "turn over")
        self.phase = HalfDuplexPhase.LISTENING
        self.last_activity = now

    def deadline(self) -> tuple[float, str]:
        if self.unprepared:
            return super().deadline()
        if self.phase is HalfDuplexPhase.ANSWERING:
            return math.inf, "timeout"  # answering counts as activity
        return self.last_activity + self.timeout_s, "timeout"
