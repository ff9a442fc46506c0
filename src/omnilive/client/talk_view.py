"""What ``omnilive talk`` shows: the queue, what the model hears and says, and
how long each answer took to start.

One line per happening, the model's words streamed onto an ``AI:`` line as
they come. Latency is what the user lives through, measured on this machine:
from the end of their voice (the last voiced 10 ms of audio that went out;
for a typed question, when it was sent) to the first sound of the answer.
"""

from __future__ import annotations

import time
from typing import TextIO

from omnilive.client.machine import QueueStatus


class TalkView:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._speaking = False  # an AI: line is open
        self._turn_ended_at: float | None = None
        self._first_sound: float | None = None
        self.latencies: list[float] = []

    def line(self, text: str) -> None:
        if self._speaking:
            self.out.write("\n")
            self._speaking = False
        self.out.write(text + "\n")
        self.out.flush()

    def queued(self, queue: QueueStatus) -> None:
        eta = f", about {queue.estimated_wait_s:.0f} s" if queue.estimated_wait_s else ""
        length = f" of {queue.queue_length}" if queue.queue_length else ""
        self.line(f"queued: position {queue.position}{length}{eta}")

    def hearing(self, speaking: bool) -> None:
        self.line("[hearing you]" if speaking else "[heard you]")

    # --- the model's turn -----------------------------------------------------------------

    def user_turn_ended(self, at: float | None = None) -> None:
        """The user stopped: the next sound of the model measures the latency."""
        self._turn_ended_at = time.monotonic() if at is None else at
        self._first_sound = None

    def says(self, text: str) -> None:
        if not text:
            return
        if not self._speaking:
            self.out.write("AI: ")
            self._speaking = True
        self.out.write(text)
        self.out.flush()

    def sound(self) -> None:
        """The first audio of an answer arrived."""
        if self._first_sound is None and self._turn_ended_at is not None:
            self._first_sound = time.monotonic()
            self.latencies.append(self._first_sound - self._turn_ended_at)

    def turn_done(self) -> None:
        if self._speaking:
            self.out.write("\n")
            self._speaking = False
        if self._first_sound is not None and self._turn_ended_at is not None:
            latency = self._first_sound - self._turn_ended_at
            self.line(f"latency: {latency:.2f} s (end of your turn to the first sound)")
        self.out.flush()
        self._turn_ended_at = self._first_sound = None
