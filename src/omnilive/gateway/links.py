"""The gateway's view of each worker: a control channel that the worker pushes
its state over (readiness is that push, not a poll), and the periodic health
check of the reference for the statistics ``/workers`` shows."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import ValidationError
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake, WebSocketException

from omnilive.config import Settings
from omnilive.gateway.pool import PoolFace
from omnilive.gateway.scheduler import Lease, WorkerHealth
from omnilive.protocol.internal import WorkerStatus, bearer, ws_url

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 1.0
# Keepalive pings on the control channel: a worker whose event loop stops
# answering for this long is treated as gone, and so are its sessions (their
# own sockets carry no pings: ``protocol/internal.py`` says why).
PING_INTERVAL_S = 2.0
PING_TIMEOUT_S = 5.0
# A hung worker never completes the closing handshake: give up on it quickly.
CLOSE_TIMEOUT_S = 1.0


def health_of(worker_status: str) -> WorkerHealth:
    if worker_status == "loading":
        return WorkerHealth.LOADING
    if worker_status == "error":
        return WorkerHealth.ERROR
    return WorkerHealth.READY


class WorkerLink:
    """Keeps one worker's state current in the pool."""

    def __init__(self, worker_id: str, url: str, settings: Settings, pool: PoolFace) -> None:
        self.worker_id = worker_id
        self.url = url
        self.settings = settings
        self.pool = pool
        self.last_status: WorkerStatus | None = None
        self.last_health_at: float | None = None
        self.connected = False
        self.failure: str | None = None  # why the supervisor gave this worker up
        # Called with the worker's id and last pid when an established control
        # channel is lost while the worker was serving (not loading): a crash or a hang.
        self.on_lost: Callable[[str, int | None], None] | None = None
        # Called with the worker's id whenever it is taken for gone (offline):
        # the sessions it served end (``SessionRegistry.worker_gone``).
        self.on_offline: Callable[[str], object] | None = None  # what it returns is not read
        self._changed = asyncio.Event()
        self._knock = asyncio.Event()
        pool.add_worker(worker_id, url)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_settled(self) -> None:
        """Until the worker holds no session (or is gone): it has finished
        its sessions' recordings, so it can be stopped without losing them."""
        while self.connected and self.last_status is not None and self.last_status.sessions:
            await self._changed.wait()

    def _apply(self, status: WorkerStatus) -> None:
        self.last_status = status
        self._notify()
        self.pool.set_worker_state(
            self.worker_id,
            health_of(status.worker_status),
            slots=status.slots,
            capabilities=status.capabilities,
        )

    def _receive(self, raw: str | bytes) -> None:
        try:
            status = WorkerStatus.model_validate_json(raw)
        except ValidationError as exc:  # a worker of another version, or a bug
            log.error("worker %s: unreadable status: %s", self.worker_id, exc)
            return
        self._apply(status)

    def mark_offline(self) -> None:
        self.connected = False
        self.pool.set_worker_state(self.worker_id, WorkerHealth.OFFLINE)
        if self.on_offline is not None:
            self.on_offline(self.worker_id)
        self._notify()

    def give_up(self, reason: str) -> None:
        """The supervisor will not start this worker again: it shows as
        ``error`` with ``reason``, and takes no tickets."""
        self.failure = reason
        self.mark_offline()

    async def run_control(self) -> None:
        """Follow the worker's pushed state; reconnect after it goes away."""
        delay = RECONNECT_MIN_S
        url = ws_url(self.url, "/internal/control")
        while True:
            try:
                async with connect(
                    url,
                    additional_headers=bearer(self.settings.internal_token),
                    open_timeout=5,
                    ping_interval=PING_INTERVAL_S,
                    ping_timeout=PING_TIMEOUT_S,
                    close_timeout=CLOSE_TIMEOUT_S,
                ) as ws:
                    self.connected = True
                    delay = RECONNECT_MIN_S
                    log.info("worker %s: control channel up", self.worker_id)
                    async for raw in ws:
                        self._receive(raw)
            except (OSError, TimeoutError, InvalidHandshake, WebSocketException):
                pass
            if self.connected:
                log.warning("worker %s: control channel lost", self.worker_id)
                last = self.last_status
                serving = last is not None and last.worker_status != "loading"
                if self.on_lost is not None and serving:
                    self.on_lost(self.worker_id, last.pid if last else None)
            self.mark_offline()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._knock.wait(), delay)
            self._knock.clear()
            delay = min(delay * 2, RECONNECT_MAX_S)

    def knock(self) -> None:
        """The worker is up (its supervisor heard so): connect now, not after the backoff."""
        self._knock.set()

    async def run_health(self, client: httpx.AsyncClient) -> None:
        """``GET /health`` every ``health_interval_s``; a worker that does not
        answer in ``health_timeout_s`` is taken out of rotation until it does."""
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.check_health(client)

    async def check_health(self, client: httpx.AsyncClient) -> None:
        try:
            response = await client.get(
                f"{self.url}/health",
                headers=bearer(self.settings.internal_token),
                timeout=self.settings.health_timeout_s,
            )
            response.raise_for_status()
            # Only a heartbeat: the worker's state comes from its control
            # channel (its pushes carry the same statistics). A health answer
            # sent before the latest push must not undo it, and a worker whose
            # channel is not up yet is not ready for the pool. An answer does
            # restore the last pushed state after a check that timed out.
            self.last_health_at = time.time()
            if self.connected and self.last_status is not None:
                self._apply(self.last_status)
        except (httpx.HTTPError, ValueError):
            if self.connected:
                log.warning("worker %s: health check failed", self.worker_id)
                self.pool.set_worker_state(self.worker_id, WorkerHealth.ERROR)

    def _status_name(self, health: WorkerHealth) -> str:
        if self.failure is not None:
            return "error"
        if health is WorkerHealth.OFFLINE:
            return "offline"
        return self.last_status.worker_status if self.last_status else "offline"

    def describe(self) -> dict[str, Any]:
        record = self.pool.scheduler.workers[self.worker_id]
        status = self.last_status
        current = next(iter(record.leases.values()), None)
        progress = status.load_progress.model_dump() if status else None
        return {
            "worker_id": self.worker_id,
            "url": self.url,
            "status": self._status_name(record.health),
            "health": record.health.value,
            "engine": status.engine if status else None,
            "pid": status.pid if status else None,
            "slots": record.slots,
            "slots_busy": len(record.leases),
            "capabilities": record.capabilities,
            "current_session_id": current.session_id if current else None,
            # Every session holding one of its slots (a batching engine holds several).
            "sessions": [_lease_info(lease) for lease in record.leases.values()],
            "current_request_type": current.request_type if current else None,
            "task_started_at": current.started_at if current else None,
            "total_requests": record.total_requests,
            "avg_inference_time_ms": status.avg_inference_time_ms if status else None,
            "kv_cache_length": status.kv_cache_length if status else None,
            "load_progress": progress,
            "error": self.failure or (status.error if status else None),
            "gpu_id": status.gpu_id if status else None,
            "last_heartbeat": self.last_health_at,
        }


def _lease_info(lease: Lease) -> dict[str, Any]:
    return {
        "session_id": lease.session_id,
        "request_type": lease.request_type,
        "started_at": lease.started_at,
    }


async def close_quietly(client: httpx.AsyncClient) -> None:
    with contextlib.suppress(Exception):
        await client.aclose()
