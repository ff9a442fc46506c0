"""A worker as a Ray actor: the worker's own app, served by uvicorn on a free
port of the actor's node, registered with the registry.

The actor is only a host: sessions reach the worker over its internal
WebSocket API, as on one machine. When the actor's process dies, its sockets
close (the gateways' sessions on it fail at once, the registry's control
channel drops), Ray starts the actor again, and the new incarnation
registers its new address under the same worker id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from omnilive.cluster.ray_api import REGISTRY_NAME, import_ray
from omnilive.config import Settings
from omnilive.header_deadline import http_protocol
from omnilive.logs import configure_logging
from omnilive.protocol.internal import SESSION_PING_INTERVAL_S, LoadOutcome, LoadReport
from omnilive.serving import WS_FRAME_MARGIN, ExitCode, listen_socket

log = logging.getLogger(__name__)

_LOAD_CODES = {
    LoadOutcome.UNAVAILABLE: ExitCode.ENGINE_UNAVAILABLE,
    LoadOutcome.FAILED: ExitCode.INTERNAL,
}


def _node_address(ray: Any) -> str:
    """The address this actor's node joined the cluster with (``--node-ip-address``)."""
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class WorkerHost:
    """One worker: its engine, its sessions, its internal API (one per GPU)."""

    def __init__(self, settings_json: str, worker_id: str) -> None:
        import uvicorn

        from omnilive.worker.app import create_worker_app

        ray = import_ray()
        settings = Settings.model_validate_json(settings_json)
        configure_logging(
            settings.log_level, f"worker {worker_id}", settings.log_json, settings.log_stream
        )
        host = settings.ray.worker_host or _node_address(ray)
        sock = listen_socket(host, 0)
        sock.listen(1024)  # connections wait in the backlog until uvicorn runs
        self.url = _url(host, sock.getsockname()[1])
        registry = ray.get_actor(REGISTRY_NAME, namespace=settings.ray.namespace)

        def loaded(report: LoadReport) -> None:
            code = _LOAD_CODES.get(report.outcome)
            if code is not None:
                registry.worker_failed.remote(worker_id, report.reason, int(code))

        app = create_worker_app(settings, worker_id, on_load=loaded)
        config = uvicorn.Config(
            app,
            log_level=settings.log_level,
            ws_max_size=settings.limits.max_message_bytes + WS_FRAME_MARGIN,
            ws_ping_interval=SESSION_PING_INTERVAL_S,  # see protocol/internal.py
            http=http_protocol(settings.limits.header_timeout_s),
            lifespan="on",
            log_config=None,
        )
        server = uvicorn.Server(config)
        # Its own thread and loop: the actor's thread answers Ray meanwhile.
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])),
            name=f"worker-{worker_id}",
            daemon=True,
        )
        self._thread.start()
        registry.register_worker.remote(worker_id, self.url)
        log.info("worker %s (pid %d) serves at %s", worker_id, os.getpid(), self.url)

    def address(self) -> str:
        return self.url
