"""A Ray cluster on this machine for tests and benchmarks: a head node (and
more nodes on demand) from ``ray start --block``, each in its own process
group, and omnilive gateways on it: ``serve --ray`` first, then ``gateway
--ray``. Ray's token authentication is on, with a token of its own."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import Server, free_port

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def ray_env(**settings: str) -> dict[str, str]:
    """The environment of every process of the cluster, with omnilive ``settings``."""
    return {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Few cores: no idle Python workers started ahead of need.
        "RAY_enable_worker_prestart": "0",
        **settings,
    }


@dataclass
class Cluster:
    address: str
    env: dict[str, str]
    tmp: Path
    gateways: list[Server] = field(default_factory=list)
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ray_node(self, *args: str) -> subprocess.Popen[bytes]:
        """``ray start --block`` in its own process group (SIGTERM stops its node)."""
        log = open(self.tmp / f"ray-node-{len(self.nodes)}.log", "wb")  # noqa: SIM115
        node = subprocess.Popen(
            [RAY, "start", "--block", "--disable-usage-stats",
             "--object-store-memory", str(OBJECT_STORE_BYTES), *args],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.nodes.append(node)
        return node

    def add_gpu_node(self) -> None:
        self.ray_node("--address", self.address, "--num-cpus", "1", "--num-gpus", "1")

    def gateway(self, command: str, workers: int = 1) -> Server:
        """``omnilive serve --ray`` (the deployment) or ``gateway --ray`` (one more), started."""
        server = Server(
            self.tmp, command=command, workers=workers, args=["--ray", self.address], env=self.env
        )
        self.gateways.append(server.start())
        return server

    def stop(self) -> None:
        for gateway in reversed(self.gateways):
            gateway.stop()
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


def start_cluster(tmp: Path, env: dict[str, str], cpus: int, gpus: int = 0) -> Cluster:
    """A head node, up and answering."""
    port = free_port()
    cluster = Cluster(f"127.0.0.1:{port}", env, tmp)
    cluster.ray_node("--head", "--port", str(port), "--num-cpus", str(cpus),
                     "--num-gpus", str(gpus), "--include-dashboard=false")  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        probe = subprocess.run(
            [RAY, "status", "--address", cluster.address],
            env=env, capture_output=True, check=False,
        )  # fmt: skip
        if probe.returncode == 0:
            return cluster
        if cluster.nodes[0].poll() is not None:
            break
        time.sleep(0.5)
    cluster.stop()
    raise RuntimeError(f"the Ray head did not start:\n{(tmp / 'ray-node-0.log').read_text()}")
