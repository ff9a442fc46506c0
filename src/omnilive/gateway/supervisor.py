"""``omnilive serve``: start the workers, watch them, restart the ones that die.

A worker that exits is marked offline in the pool at once (its clients'
sessions fail over their own sockets), then started again after a backoff
that doubles while it keeps dying and resets once it has run a while.
A worker that stops answering its control channel but does not exit (hung)
is killed, and so restarted the same way. A worker that cannot load its
engine is not restarted in a loop: see :class:`Supervisor`.

``serve`` binds each worker's listening socket itself, before any worker
starts (:func:`worker_sockets`), and hands it to every life of that worker:
a port in use stops ``serve`` at once, a worker on port 0 keeps the port the
system gave it across restarts, and no other process can take the port
between a probe and a bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omnilive.config import Settings
from omnilive.protocol.internal import LISTEN_FD_ENV, REPORT_FD_ENV, LoadOutcome, LoadReport
from omnilive.serving import ExitCode, listen_socket

log = logging.getLogger(__name__)

STABLE_AFTER_S = 60.0
STOP_GRACE_S = 5.0
# After its control channel is lost, how long a worker may take to exit by
# itself before it is taken for hung and killed.
LOST_GRACE_S = 1.0
# After a worker exits, how long its last load report may take to be read.
REPORT_DRAIN_S = 2.0
SETTINGS_ENV = "OMNILIVE_SETTINGS_JSON"


def die_with_parent() -> None:
    """Linux: have the kernel SIGTERM the worker if the gateway dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def worker_sockets(settings: Settings) -> list[socket.socket]:
    """The listening socket of each of ``settings.workers``: worker k on
    ``worker_base_port + k``, or each on a port of the system's choosing
    when ``worker_base_port`` is 0. Raises :class:`StartupError` for a port
    that cannot be bound (the sockets bound before it are closed)."""
    base = settings.worker_base_port
    bound: list[socket.socket] = []
    try:
        for index in range(settings.workers):
            bound.append(listen_socket(settings.worker_host, base + index if base else 0))
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def describe_exit(code: int) -> str:
    """``signal 11 (SIGSEGV)`` or ``exit status 3``, from an asyncio return code."""
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


@dataclass(frozen=True)
class GaveUp:
    """A worker the supervisor no longer restarts, and why."""

    worker_id: str
    reason: str
    code: ExitCode


class Supervisor:
    """Owns the worker processes of one ``serve``.

    A worker tells it over a pipe when its engine has loaded (or why it
    cannot). One that cannot load as configured is not started again; one
    that dies ``max_failed_loads`` times in a row before loading is given up
    too. ``on_give_up`` hears of each; once every worker is given up, ``serve``
    has nothing left to serve with and stops."""

    def __init__(
        self,
        settings: Settings,
        sockets: Sequence[socket.socket],
        on_exit: Callable[[str], None],
        on_give_up: Callable[[GaveUp], None],
        on_ready: Callable[[str], None] = lambda worker_id: None,
    ) -> None:
        self.settings = settings
        self.sockets = sockets  # worker k's listening socket, kept open across its lives
        self.on_exit = on_exit
        self.on_give_up = on_give_up
        self.on_ready = on_ready
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.restarts: dict[str, int] = {}
        self.given_up: dict[str, GaveUp] = {}
        self._lost: dict[str, asyncio.Event] = {}
        self._stopping = False

    def worker_lost(self, worker_id: str, pid: int | None) -> None:
        """The gateway lost its control channel to this worker (pid as last
        reported). If that process is still running it is hung: kill it."""
        process = self.processes.get(worker_id)
        if process is None or process.returncode is not None:
            return
        if pid is not None and process.pid != pid:
            return  # an earlier incarnation, already replaced
        lost = self._lost.get(worker_id)
        if lost is not None:
            lost.set()

    async def _watch(self, worker_id: str, process: asyncio.subprocess.Process) -> int:
        """The exit code of ``process``, killing it if it is reported lost
        and does not exit within ``LOST_GRACE_S``."""
        lost = self._lost[worker_id] = asyncio.Event()
        exited = asyncio.create_task(process.wait(), name=f"{worker_id}:exit")
        try:
            while True:
                signalled = asyncio.create_task(lost.wait(), name=f"{worker_id}:lost")
                try:
                    await asyncio.wait([exited, signalled], return_when="FIRST_COMPLETED")
                finally:
                    signalled.cancel()
                    await asyncio.gather(signalled, return_exceptions=True)
                if exited.done():
                    return exited.result()
                lost.clear()
                done, _ = await asyncio.wait([exited], timeout=LOST_GRACE_S)
                if not done:
                    log.warning("worker %s (pid %d) does not answer: killing it",
                                worker_id, process.pid)  # fmt: skip
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                return await exited
        finally:
            if not exited.done():
                exited.cancel()
                await asyncio.gather(exited, return_exceptions=True)

    async def _spawn(
        self, worker_id: str, index: int
    ) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader]:
        """Start a worker; the reader yields the load reports it writes."""
        env = dict(os.environ)
        env[SETTINGS_ENV] = self.settings.to_json()
        listening = self.sockets[index].fileno()
        env[LISTEN_FD_ENV] = str(listening)
        read_fd, write_fd = os.pipe()
        env[REPORT_FD_ENV] = str(write_fd)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "omnilive", "worker", "--worker-id", worker_id,
                env=env,
                pass_fds=(write_fd, listening),
                # Its own process group: a Ctrl-C in the terminal reaches only the
                # gateway, which stops the workers itself (they are not restarted).
                start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        reports = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reports), os.fdopen(read_fd, "rb")
        )
        return process, reports

    async def _one_life(self, worker_id: str, index: int) -> tuple[int, LoadReport | None]:
        """Run one worker process to its end: its exit code and its last load report."""
        process, reports = await self._spawn(worker_id, index)
        self.processes[worker_id] = process
        log.info("worker %s started (pid %d)", worker_id, process.pid)
        last: list[LoadReport] = []

        async def read_reports() -> None:
            while line := await reports.readline():
                report = LoadReport.decode(line)
                if report is not None:
                    last.append(report)
                    if report.outcome is LoadOutcome.READY:
                        log.info("worker %s loaded its engine", worker_id)
                        self.on_ready(worker_id)

        reader = asyncio.create_task(read_reports(), name=f"{worker_id}:load-reports")
        try:
            code = await self._watch(worker_id, process)
            # The pipe ends with the process; what it wrote last is still in it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), REPORT_DRAIN_S)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        return code, (last[-1] if last else None)

    async def run_worker(self, worker_id: str, index: int) -> None:
        """Keep one worker process alive until the supervisor stops, or until
        it is clear that it cannot load."""
        backoff = 0.5
        failed_loads = 0
        while not self._stopping:
            started = time.monotonic()
            code, report = await self._one_life(worker_id, index)
            if self._stopping:
                return
            self.on_exit(worker_id)
            self.restarts[worker_id] = self.restarts.get(worker_id, 0) + 1
            if report is not None and report.outcome is LoadOutcome.READY:
                failed_loads = 0
                if time.monotonic() - started > STABLE_AFTER_S:
                    backoff = 0.5
                what = f"worker {worker_id} exited with {describe_exit(code)}"
            else:
                failed_loads += 1
                if report is not None and report.outcome is LoadOutcome.UNAVAILABLE:
                    reason = f"worker {worker_id} cannot load its engine: {report.reason}"
                    self._give_up(worker_id, index, reason, ExitCode.ENGINE_UNAVAILABLE)
                    return
                why = report.reason if report is not None else describe_exit(code)
                what = f"worker {worker_id} died during load: {why}"
                if failed_loads >= self.settings.max_failed_loads:
                    reason = f"{what}, {failed_loads} loads in a row"
                    self._give_up(worker_id, index, reason, ExitCode.WORKERS_FAILED)
                    return
            log.warning("%s; restarting in %.1f s", what, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.restart_backoff_max_s)

    def _give_up(self, worker_id: str, index: int, reason: str, code: ExitCode) -> None:
        log.error("%s; not starting it again", reason)
        # Nobody will accept on it again: connections are refused, not left waiting.
        self.sockets[index].close()
        gave_up = self.given_up[worker_id] = GaveUp(worker_id, reason, code)
        self.on_give_up(gave_up)

    async def stop(self) -> None:
        """Terminate every worker, killing those that do not exit in time."""
        self._stopping = True
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in running:
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        for sock in self.sockets:
            sock.close()
