"""What the long-lived session runners (half-duplex, duplex) have in common:
the worker builds either one from the same five things and only awaits
:meth:`StreamingRunner.run`, so the two stay interchangeable.

Every task of a session lives in one :class:`asyncio.TaskGroup`, named after
the session. The main ones (the reader, the watchdog, a compute loop) end
together: the first to return ends the session and the others are cancelled.
Tasks started on the way (a prepare, a turn, a finalize) are the group's too,
so none is left behind and none fails unseen: an unexpected error in any of
them ends the session, raised to the worker in an ``ExceptionGroup``.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from omnilive.config import Settings
from omnilive.worker.machines.session import Ended, SessionMachine
from omnilive.worker.outbox import Outbox
from omnilive.worker.runtime import SessionRecord, WorkerRuntime
from omnilive.wsutil import FrameSource

WATCHDOG_POLL_S = 0.25  # how often a deadline further away is looked at again

Work = Callable[[], Coroutine[Any, Any, None]]


class StreamingRunner(abc.ABC):
    """One long-lived session: it reads the client's ``frames`` and sends
    through ``outbox``, the session's single writer."""

    machine: SessionMachine[Any]  # the mode's rules, made by _init_state

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
        self._group: asyncio.TaskGroup | None = None
        self._preparing: asyncio.Task[None] | None = None  # a stop does not wait for it
        self._init_state()

    @abc.abstractmethod
    def _init_state(self) -> None:
        """The mode's own state (its engine session, phase, counters), set up
        once the attributes above are in place."""

    @abc.abstractmethod
    def _main_tasks(self) -> dict[str, Work]:
        """The tasks that live as long as the session, by name; the first of
        them to return ends it (the machine says why)."""

    @abc.abstractmethod
    async def _wind_down(self) -> None:
        """Once the main tasks are over, whatever else still runs is finished
        (the group's last tasks) and the recording is closed. Runs however
        the session ended, a failure included."""

    @abc.abstractmethod
    async def _goodbye(self, ended: Ended) -> None:
        """Tell the client how a session that ended normally ended."""

    async def run(self) -> str:
        """Serve until the session ends; returns why (e.g. ``stopped``).
        An unexpected error in any of its tasks is raised, in an
        ``ExceptionGroup``, once every task of the session has ended."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            main = [self.spawn(name, work()) for name, work in self._main_tasks().items()]
            try:
                await asyncio.wait(main, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if self._preparing is not None:
                    main.append(self._preparing)
                for task in main:
                    task.cancel()
                await asyncio.wait(main)  # how each ended is the group's to read
                await self._wind_down()
        ended = self.machine.ended or self.machine.disconnected()
        await self._goodbye(ended)
        return ended.reason

    async def _watchdog(self) -> None:
        """Ends the session at its machine's deadlines (not prepared in time,
        inactivity, a pause that expired): a main task where a mode has them."""
        while self.machine.tick(time.monotonic()) is None:
            at, _ = self.machine.deadline()
            await asyncio.sleep(min(max(at - time.monotonic(), 0.0), WATCHDOG_POLL_S))

    def spawn(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a task of this session in its group. Whoever starts it may
        cancel it or wait for it (``asyncio.wait``); the group reads how it
        ended, so its error is never lost and ends the session."""
        if self._group is None:
            work.close()
            raise RuntimeError("the session is not running")
        return self._group.create_task(work, name=f"{self.record.session_id}:{name}")

    async def send(self, message: dict[str, Any]) -> None:
        await self.outbox.put(message)
