"""A local Ray cluster for the module's tests: a head node with two (declared)
GPUs, started once, with ``omnilive serve --ray`` (the scripted engine, one
worker actor per GPU) and a second gateway, ``omnilive gateway --ray``, in
front of it. Everything is a real process; nothing of Ray is mocked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.clients import close_all
from tests.cluster.local import Cluster, ray_env, start_cluster

GPUS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = ray_env(
        OMNILIVE_RAY__WORKER_GPUS="1",
        # Ray names a node by its host's address; one host: workers on loopback.
        OMNILIVE_RAY__WORKER_HOST="127.0.0.1",
        OMNILIVE_RAY__PLACEMENT_INTERVAL_S="0.5",
        OMNILIVE_RAY__GATEWAY_TIMEOUT_S="5",
    )
    found = start_cluster(tmp_path_factory.mktemp("cluster"), env, cpus=4, gpus=GPUS)
    try:
        first = found.gateway("serve")
        asyncio.run(first.wait_ready(timeout=90, workers=GPUS))
        second = found.gateway("gateway")
        asyncio.run(second.wait_ready(timeout=60, workers=GPUS))
        yield found
    finally:
        found.stop()


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await close_all()
