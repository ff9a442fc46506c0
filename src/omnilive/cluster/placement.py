"""Where workers run: one worker actor per ``ray.worker_gpus`` GPUs of the
cluster, counted again every ``ray.placement_interval_s`` so that a GPU node
that joins gets its workers; or, for CPU engines, ``workers`` actors of
``ray.worker_cpus`` CPUs each. Ray restarts a worker actor that dies
(``ray.max_restarts``); the placer never removes one."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from omnilive.cluster.ray_api import import_ray, worker_actor_name
from omnilive.config import Settings

log = logging.getLogger(__name__)


class Placer:
    """Starts the worker actors of one deployment; runs in the registry actor,
    which owns them (they stop with it)."""

    def __init__(self, settings: Settings, settings_json: str) -> None:
        self.settings = settings
        self.settings_json = settings_json
        self.gpus = settings.ray.gpus_per_worker(settings.engine)
        self.handles: dict[str, Any] = {}
        self.warned = False

    def _wanted(self) -> int:
        if not self.gpus:
            return self.settings.workers
        total = import_ray().cluster_resources().get("GPU", 0.0)
        return int(total // self.gpus)

    async def run(self) -> None:
        while True:
            # Asks the cluster's control store: off the actor's loop.
            wanted = await asyncio.to_thread(self._wanted)
            if not wanted and not self.warned:
                log.warning("no GPU in the cluster yet: no worker placed (for CPU workers, "
                            "set ray.worker_gpus = 0 and --workers N)")  # fmt: skip
                self.warned = True
            while len(self.handles) < wanted:
                self._place(f"w{len(self.handles)}")
            if not self.gpus:
                return  # a fixed number of CPU workers
            await asyncio.sleep(self.settings.ray.placement_interval_s)

    def _place(self, worker_id: str) -> None:
        from omnilive.cluster.worker_actor import WorkerHost

        ray = import_ray()
        actor_class = ray.remote(WorkerHost)
        ray_settings = self.settings.ray
        self.handles[worker_id] = actor_class.options(
            name=worker_actor_name(worker_id),
            namespace=ray_settings.namespace,
            get_if_exists=True,
            num_gpus=self.gpus,
            num_cpus=ray_settings.worker_cpus,
            max_restarts=ray_settings.max_restarts,
        ).remote(self.settings_json, worker_id)
        what = f"{self.gpus:g} GPU" if self.gpus else f"{ray_settings.worker_cpus:g} CPU"
        log.info("placing worker %s (%s)", worker_id, what)

    def retire(self, worker_id: str) -> None:
        """Stop a worker for good (its engine cannot load): Ray does not restart it."""
        handle = self.handles.get(worker_id)
        if handle is not None:
            import_ray().kill(handle, no_restart=True)

    def stop(self) -> None:
        ray = import_ray()
        for handle in self.handles.values():
            ray.kill(handle, no_restart=True)
