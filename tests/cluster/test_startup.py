"""Problems joining a cluster stop ``omnilive`` in one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cluster.local import Cluster
from tests.servers import free_port


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "omnilive", *args, "--port", str(free_port())]
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def test_a_cluster_that_does_not_answer(cluster: Cluster):
    address = f"127.0.0.1:{free_port()}"
    done = run(["gateway", "--ray", address], cluster.env, cluster.tmp)
    assert done.returncode == 2
    assert last_line(done) == (
        f"omnilive gateway: cannot join the Ray cluster at {address}: Connection refused"
    )


def test_a_cluster_without_a_deployment(cluster: Cluster):
    env = {**cluster.env, "OMNILIVE_RAY__NAMESPACE": "nobody"}
    done = run(["gateway", "--ray", cluster.address], env, cluster.tmp)
    assert done.returncode == 2
    assert last_line(done) == (
        f"omnilive gateway: no omnilive deployment in namespace 'nobody' of the Ray cluster "
        f"at {cluster.address}: start one with `omnilive serve --ray {cluster.address}`"
    )


def test_a_wrong_cluster_token(cluster: Cluster):
    env = {**cluster.env, "RAY_AUTH_TOKEN": "0" * 32}
    done = run(["gateway", "--ray", cluster.address], env, cluster.tmp)
    assert done.returncode == 2
    assert last_line(done) == (
        f"omnilive gateway: cannot join the Ray cluster at {cluster.address}: its token is "
        "missing or wrong (set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN)"
    )


def test_without_ray_installed(tmp_path: Path):
    # A `ray` that cannot be imported, first on the path: as if the extra were missing.
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    for command in ("serve", "gateway"):
        done = run([command, "--ray", "--engine", "scripted"], env, tmp_path)
        assert done.returncode == 2
        assert last_line(done) == (
            f"omnilive {command}: Ray is not installed: pip install 'omnilive[ray]'"
        )
