"""``create_app(settings)``: the gateway's ASGI application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI

from omnilive.config import Settings
from omnilive.gateway.auth import AuthMiddleware, Gatekeeper, install_log_filter
from omnilive.gateway.body_deadline import BodyDeadline
from omnilive.gateway.catalogs import Catalogs
from omnilive.gateway.http_errors import install_error_handlers
from omnilive.gateway.links import WorkerLink, close_quietly
from omnilive.gateway.live_stats import sample_periodically
from omnilive.gateway.metrics import GatewayMetrics, live_reading
from omnilive.gateway.observe import ObserveMiddleware
from omnilive.gateway.pool import Pool
from omnilive.gateway.routes import (
    admin,
    apps,
    chat,
    client_secrets,
    duplex,
    half_duplex,
    live,
    metrics,
    pages,
    presets,
    queue,
    realtime,
    sessions,
    status,
    voices,
    webrtc,
)
from omnilive.gateway.state import Gateway
from omnilive.gateway.supervisor import GaveUp, Supervisor
from omnilive.gateway.webrtc import missing as webrtc_missing
from omnilive.recording.cleanup import cleanup_periodically
from omnilive.serving import MediaSocket, ProcessExit, http_url
from omnilive.tasks import TaskSet

if TYPE_CHECKING:
    from omnilive.cluster.deploy import Deployment
    from omnilive.gateway.webrtc.calls import Calls

log = logging.getLogger(__name__)
# On shutdown, how long workers may take to finish the sessions the gateway
# closed (their recordings) before they are stopped.
WORKER_SETTLE_S = 10.0


async def _workers_settled(gateway: Gateway, timeout_s: float) -> None:
    settling = [link.wait_settled() for link in gateway.links.values()]
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*settling)
    except TimeoutError:
        log.warning("workers still hold sessions after %.0f s; stopping them anyway", timeout_s)


def _webrtc_calls(settings: Settings, media: MediaSocket | None) -> Calls | None:
    """The registry of WebRTC calls, or None where aiortc or PyAV cannot be
    imported: the gateway still serves every mode over the WebSocket. With
    ``webrtc.media_processes`` and the gateway's internal socket (``media``),
    the calls run in media processes, started here."""
    reason = webrtc_missing()
    if reason is not None:
        log.warning("WebRTC is off: %s; calls are refused, the WebSocket serves", reason)
        return None
    from omnilive.gateway.webrtc.calls import Calls  # imports aiortc

    calls = Calls(settings.webrtc)
    count = settings.webrtc.media_process_count()
    if count == 0 or not settings.webrtc.enabled:
        return calls
    if media is None:
        log.warning("webrtc.media_processes is %d, but this gateway has no internal socket "
                    "for their sessions; its calls run in its own process", count)  # fmt: skip
        return calls
    from omnilive.gateway.webrtc.media_pool import MediaPool
    from omnilive.gateway.webrtc.media_process import MediaConfig

    config = MediaConfig(
        name="", webrtc=settings.webrtc, max_message_bytes=settings.limits.max_message_bytes,
        gateway_socket=media.path, tls=media.tls, log_level=settings.log_level,
        log_json=settings.log_json, log_stream=settings.log_stream,
    )  # fmt: skip
    calls.media = MediaPool(config, count)
    calls.media.start(calls)
    log.info("WebRTC calls run in %d media processes", count)
    return calls


def _start_workers(
    gateway: Gateway,
    supervised: Sequence[socket.socket] | None,
    process_exit: ProcessExit | None,
    tasks: TaskSet,
    client: httpx.AsyncClient,
) -> None:
    """Links to the workers of ``--worker`` URLs, or to the workers that this
    process supervises (``serve``), one on each of the ``supervised`` sockets."""
    settings, pool = gateway.settings, gateway.pool
    urls = list(settings.worker_urls)
    if supervised is not None:
        urls = [http_url(settings.worker_host, sock) for sock in supervised]
    for index, url in enumerate(urls):
        worker_id = f"w{index}"
        link = gateway.links[worker_id] = WorkerLink(worker_id, url, settings, pool)
        link.on_offline = gateway.sessions.worker_gone
    if supervised is not None:

        def gave_up(worker: GaveUp) -> None:
            gateway.links[worker.worker_id].give_up(worker.reason)
            if process_exit is not None and len(supervisor.given_up) == len(urls):
                process_exit.request(worker.code, f"no worker can serve: {worker.reason}")

        supervisor = gateway.supervisor = Supervisor(
            settings,
            supervised,
            on_exit=lambda wid: gateway.links[wid].mark_offline(),
            on_give_up=gave_up,
            on_ready=lambda wid: gateway.links[wid].knock(),
        )
        for index, worker_id in enumerate(gateway.links):
            tasks.spawn(f"supervise-{worker_id}", gateway.supervisor.run_worker(worker_id, index))
            gateway.links[worker_id].on_lost = gateway.supervisor.worker_lost
    for worker_id, link in gateway.links.items():
        tasks.spawn(f"control-{worker_id}", link.run_control())
        tasks.spawn(f"health-{worker_id}", link.run_health(client))


def create_app(
    settings: Settings,
    supervised: Sequence[socket.socket] | None = None,
    process_exit: ProcessExit | None = None,
    cluster: Deployment | None = None,
    media: MediaSocket | None = None,
) -> FastAPI:
    """The gateway. With ``supervised`` (the listening sockets of
    :func:`~omnilive.gateway.supervisor.worker_sockets`) it also starts and
    restarts a worker process on each (``omnilive serve``), and stops the
    server through ``process_exit`` once none of them can load. With
    ``cluster`` its queue and workers are those of a deployment on a Ray
    cluster, shared with the deployment's other gateways."""
    if not settings.internal_token:
        raise ValueError("the gateway needs an internal token shared with its workers")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.catalogs = await asyncio.to_thread(Catalogs.open, settings)
        pool = cluster.pool(settings) if cluster is not None else Pool(settings)
        gateway = Gateway(settings=settings, pool=pool)
        tasks = TaskSet("gateway")
        client = httpx.AsyncClient()
        if cluster is not None:
            follow = cluster.follow(gateway.links, pool, process_exit, gateway.sessions.worker_gone)
            tasks.spawn("cluster", follow)
        else:
            _start_workers(gateway, supervised, process_exit, tasks, client)
        tasks.spawn("recording-cleanup", cleanup_periodically(settings))
        registry: GatewayMetrics = app.state.metrics
        tasks.spawn("live-stats", sample_periodically(registry.live, lambda: live_reading(gateway)))
        app.state.gateway = gateway
        app.state.webrtc = calls = _webrtc_calls(settings, media)
        try:
            yield
        finally:
            if calls is not None:
                await calls.close()
            # On a cluster the registry waits for its workers, when it stops them.
            if cluster is None:
                await _workers_settled(gateway, WORKER_SETTLE_S)
            if gateway.supervisor is not None:
                await gateway.supervisor.stop()
            await tasks.close()
            await close_quietly(client)
            if cluster is not None:
                await cluster.close()

    app = FastAPI(title="omnilive", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(status.router)
    app.include_router(queue.router)
    app.include_router(chat.router)
    app.include_router(half_duplex.router)
    app.include_router(duplex.router)
    app.include_router(realtime.router)
    app.include_router(live.router)
    app.include_router(sessions.router)
    app.include_router(apps.router)
    app.include_router(presets.router)
    app.include_router(voices.router)
    app.include_router(client_secrets.router)
    app.include_router(webrtc.router)
    app.include_router(metrics.router)
    # Admin actions; access to every route is decided by gateway/access.py.
    app.include_router(admin.router)
    pages.mount_pages(app)
    # Built here, not in the lifespan: the middleware needs it, and a bad
    # keys file should stop the start-up at once.
    gatekeeper = Gatekeeper.from_settings(settings.auth, settings.limits, list(pages.PAGES))
    app.state.auth = gatekeeper
    app.state.metrics = registry = GatewayMetrics()

    def refused(code: str) -> None:
        registry.errors.inc("access", code)

    app.add_middleware(BodyDeadline, timeout_s=settings.limits.body_timeout_s)
    app.add_middleware(AuthMiddleware, gatekeeper=gatekeeper, on_refusal=refused)
    # Outermost: it also counts the refusals' HTTP statuses.
    app.add_middleware(ObserveMiddleware, metrics=registry)
    install_log_filter()
    return app
