"""``omnilive serve``: start the workers, watch them, restart the ones that die.

A worker that exits is marked offline in the pool at once (its clients'
sessions fail over their own sockets), then started again after a backoff
that doubles while it keeps dying and resets once it has run a while.
A worker that stops answering its control channel but does not exit (hung)
is killed, and so restarted the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from omnilive.config import Settings

log = logging.getLogger(__name__)

STABLE_AFTER_S = 60.0
STOP_GRACE_S = 5.0
# After its control channel is lost, how long a worker may take to exit by
# itself before it is taken for hung and killed.
LOST_GRACE_S = 1.0
SETTINGS_ENV = "OMNILIVE_SETTINGS_JSON"


def _die_with_parent() -> None:
    """Linux: have the kernel SIGTERM the worker if the gateway dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def worker_url(settings: Settings, index: int) -> str:
    return f"http://{settings.worker_host}:{settings.worker_base_port + index}"


class Supervisor:
    """Owns the worker processes of one ``serve``."""

    def __init__(self, settings: Settings, on_exit: Callable[[str], None]) -> None:
        self.settings = settings
        self.on_exit = on_exit
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.restarts: dict[str, int] = {}
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
        exited = asyncio.ensure_future(process.wait())
        try:
            while True:
                signalled = asyncio.ensure_future(lost.wait())
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

    async def _spawn(self, worker_id: str, index: int) -> asyncio.subprocess.Process:
        env = dict(os.environ)
        env[SETTINGS_ENV] = self.settings.to_json()
        port = self.settings.worker_base_port + index
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "omnilive", "worker",
            "--worker-id", worker_id, "--port", str(port),
            env=env,
            preexec_fn=_die_with_parent,
        )  # fmt: skip

    async def run_worker(self, worker_id: str, index: int) -> None:
        """Keep one worker process alive until the supervisor stops."""
        backoff = 0.5
        while not self._stopping:
            started = time.monotonic()
            process = await self._spawn(worker_id, index)
            self.processes[worker_id] = process
            log.info("worker %s started (pid %d)", worker_id, process.pid)
            code = await self._watch(worker_id, process)
            if self._stopping:
                return
            self.on_exit(worker_id)
            self.restarts[worker_id] = self.restarts.get(worker_id, 0) + 1
            if time.monotonic() - started > STABLE_AFTER_S:
                backoff = 0.5
            log.warning("worker %s exited with %s; restarting in %.1f s", worker_id, code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.restart_backoff_max_s)

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
