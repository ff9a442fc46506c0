"""What the long-lived session runners (half-duplex, duplex) have in common:
the worker builds either one from the same five things and only awaits
:meth:`StreamingRunner.run`, so the two stay interchangeable."""

from __future__ import annotations

import abc
from typing import Any

from omnilive.config import Settings
from omnilive.worker.outbox import Outbox
from omnilive.worker.runtime import SessionRecord, WorkerRuntime
from omnilive.wsutil import FrameSource


class StreamingRunner(abc.ABC):
    """One long-lived session: it reads the client's ``frames`` and sends
    through ``outbox``, the session's single writer."""

    def __init__(
        self,
        runtime: WorkerRuntime,
        record: SessionRecord,
        settings: Settings,
        frames: FrameSource,
        outbox: Outbox,
    ) -> None:
        self.runtime = runtime
        self.record = record
        self.settings = settings
        self.frames = frames
        self.outbox = outbox
        self._init_state()

    @abc.abstractmethod
    def _init_state(self) -> None:
        """The mode's own state (its engine session, phase, counters), set up
        once the attributes above are in place."""

    @abc.abstractmethod
    async def run(self) -> str:
        """Serve until the session ends; returns why (e.g. ``stopped``)."""

    async def send(self, message: dict[str, Any]) -> None:
        await self.outbox.put(message)
