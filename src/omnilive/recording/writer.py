"""The thread that does a recorder's disk work, fed through a bounded queue.

Runners never touch the disk: they hand the writer small jobs (closures over
already-decoded data) and go on. Overflow policy: when ``queue_size`` jobs are
pending, :meth:`Writer.submit` waits for room on a helper thread, so a disk
that falls behind slows its session down instead of losing recording data or
growing memory; the event loop itself never blocks.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Job = Callable[[], None]
# Most jobs drained at once before the writer calls ``after_batch`` (which
# rewrites recording.json): bounds how stale that file can be under load.
MAX_BATCH = 32
# How often an idle writer checks whether its process is shutting down.
IDLE_POLL_S = 1.0
LOG_EVERY = 100


class _Close:
    """The last job: run ``finish`` and end the thread."""

    def __init__(self, finish: Job) -> None:
        self.finish = finish


class Writer:
    """One thread, one bounded queue. Jobs run in order; a job that raises is
    logged and the writer goes on, so the session is never held up by its
    recording. ``after_batch`` runs after each batch of jobs."""

    def __init__(
        self,
        name: str,
        queue_size: int,
        after_batch: Job,
        on_abandon: Job,
    ) -> None:
        self._queue: queue.Queue[Job | _Close] = queue.Queue(maxsize=queue_size)
        self._after_batch = after_batch
        self._on_abandon = on_abandon
        self._closing = False
        self.failures = 0
        # Not a daemon: a worker that shuts down finishes its recordings first.
        self._thread = threading.Thread(target=self._run, name=name, daemon=False)
        self._thread.start()

    @property
    def closing(self) -> bool:
        return self._closing

    def submit_nowait(self, job: Job) -> bool:
        """Queue a job if there is room; False when the queue is full."""
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            return False
        return True

    async def submit(self, job: Job) -> None:
        """Queue a job, waiting off the event loop while the queue is full."""
        if self._closing:
            raise RuntimeError("recording is closed")
        if not self.submit_nowait(job):
            await asyncio.to_thread(self._queue.put, job)

    async def close(self, finish: Job) -> None:
        """Queue ``finish`` as the last job; returns once it is queued."""
        if self._closing:
            return
        self._closing = True
        item = _Close(finish)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            await asyncio.to_thread(self._queue.put, item)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to finish (tests, shutdown); True if it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    async def wait_closed(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self.join, timeout)

    # --- the thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                if not threading.main_thread().is_alive():
                    # The process is exiting and nobody will close this
                    # recording: leave it marked as ended abnormally.
                    self._guard(self._on_abandon)
                    return
                continue
            batch = [first]
            while len(batch) < MAX_BATCH and not isinstance(batch[-1], _Close):
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for job in batch:
                if isinstance(job, _Close):
                    self._guard(self._after_batch)
                    self._guard(job.finish)
                    return
                self._guard(job)
            self._guard(self._after_batch)

    def _guard(self, job: Job) -> None:
        try:
            job()
        except Exception:  # a failed write must not stop the session, nor its recording
            self.failures += 1
            # A full or read-only disk fails every job: the first gets a
            # traceback, then one line per LOG_EVERY failures.
            if self.failures == 1:
                log.exception("recording job failed in %s", self._thread.name)
            elif self.failures % LOG_EVERY == 0:
                log.error("%d recording jobs failed in %s", self.failures, self._thread.name)
