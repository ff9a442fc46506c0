"""Starting and joining a deployment on a Ray cluster.

``omnilive serve --ray`` joins (or starts) a cluster and starts the
deployment's registry actor, which places the workers; its gateway is the
first of the deployment. ``omnilive gateway --ray ADDRESS`` joins the same
cluster, finds the registry by name and serves as one more gateway. The
registry is a detached actor: a gateway that dies, the first one included,
takes neither the queue nor the workers with it. Stopping ``serve`` (SIGTERM,
Ctrl-C) stops the deployment: its workers, once their sessions are over, and
the registry; the other gateways then stop too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnilive.cluster import ray_api
from omnilive.cluster.protocol import ClusterState
from omnilive.cluster.remote_pool import ClusterPool, gateway_name
from omnilive.config import Settings
from omnilive.gateway.links import WorkerLink
from omnilive.gateway.pool import PoolFace
from omnilive.gateway.scheduler import WorkerHealth
from omnilive.serving import ExitCode, ProcessExit, StartupError

log = logging.getLogger(__name__)

# The registry may take this long to answer its first call (a cold node).
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Deployment:
    """This process's part in a deployment: the registry, and whether this
    process owns the deployment (``serve``) or only joined it (``gateway``)."""

    registry: Any
    owner: bool
    address: str
    gateway_id: str

    def pool(self, settings: Settings) -> ClusterPool:
        return ClusterPool(settings, self.registry, self.gateway_id)

    async def follow(
        self,
        links: dict[str, WorkerLink],
        pool: PoolFace,
        process_exit: ProcessExit | None,
        worker_gone: Callable[[str], object],
    ) -> None:
        """Follow the deployment's state into ``links`` and the pool's mirror;
        end the sessions on a worker the registry lost (``worker_gone``);
        stop this gateway once no worker can ever serve, or the queue is gone."""
        assert isinstance(pool, ClusterPool)

        def on_state(state: ClusterState) -> None:
            # The registry's control channels judge the workers' liveness
            # (session sockets carry no pings: protocol/internal.py).
            for worker_id, record in state.workers.items():
                if record.health is WorkerHealth.OFFLINE:
                    worker_gone(worker_id)
            if process_exit is None or not state.given_up:
                return
            if len(state.given_up) == len(state.links):
                last = state.given_up[-1]
                process_exit.request(last.code, f"no worker can serve: {last.reason}")

        def on_lost(reason: str) -> None:
            if process_exit is not None:
                process_exit.request(ExitCode.WORKERS_FAILED, reason)

        await pool.follow(links, on_state, on_lost)

    async def close(self) -> None:
        """The owner stops the deployment: its workers (after their sessions'
        recordings) and the registry."""
        if not self.owner:
            return
        ray = ray_api.import_ray()
        try:
            await self.registry.stop.remote()
        except ray.exceptions.RayError as exc:
            log.warning("the registry did not stop cleanly: %s", ray_api.first_line(exc))
        ray.kill(self.registry)


def _registry_actor(settings: Settings) -> Any:
    from omnilive.cluster.registry import Registry

    ray = ray_api.import_ray()
    # Every waiting client holds one long poll open on it.
    concurrency = 2 * settings.max_queue_size + 1000
    return (
        ray.remote(Registry)
        .options(
            name=ray_api.REGISTRY_NAME,
            namespace=settings.ray.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=concurrency,
        )
        .remote(settings.to_json())
    )


def open_deployment(settings: Settings, owner: bool) -> tuple[Settings, Deployment]:
    """Join the cluster and reach the registry (starting it when ``owner``).
    Returns this gateway's settings, with the deployment's internal token."""
    address = ray_api.join(settings, start_local=owner)
    ray = ray_api.import_ray()
    namespace = settings.ray.namespace
    if owner:
        # Workers may run anywhere: their recordings go to one absolute path.
        settings = settings.model_copy(update={"data_dir": settings.data_dir.resolve()})
        registry = _registry_actor(settings)
    else:
        try:
            registry = ray.get_actor(ray_api.REGISTRY_NAME, namespace=namespace)
        except ValueError:
            ray_api.leave()
            raise StartupError(
                f"no omnilive deployment in namespace {namespace!r} of the Ray cluster at "
                f"{address}: start one with `omnilive serve --ray {address}`"
            ) from None
    try:
        shared = Settings.model_validate_json(
            ray.get(registry.ready.remote(), timeout=READY_TIMEOUT_S)
        )
    except ray.exceptions.RayError as exc:
        ray_api.leave()
        why = ray_api.first_line(exc)
        raise StartupError(f"the deployment's registry does not answer: {why}") from None
    if owner and shared.internal_token != settings.internal_token:
        log.warning("a deployment was already running in namespace %r: serving it", namespace)
    mine = settings.model_copy(update={"internal_token": shared.internal_token})
    gateway_id = gateway_name()
    log.info("gateway %s of the deployment on %s; more: omnilive gateway --ray %s",
             gateway_id, address, address)  # fmt: skip
    return mine, Deployment(registry, owner, address, gateway_id)
