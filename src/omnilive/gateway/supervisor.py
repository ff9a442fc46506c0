"""``omnilive serve``: start the workers, watch them, restart the ones that die.

A worker that exits is marked offline in the pool at once (its clients'
sessions fail over their own sockets), then started again after a backoff
that doubles while it keeps dying and resets once it has run a while.
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
        self._stopping = False

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
            code = await process.wait()
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
