"""A real ``omnilive worker --engine minicpmo`` with a bad checkpoint reports why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.servers import free_port


def test_a_worker_with_a_bogus_model_path_reports_error_with_the_reason(tmp_path: Path):
    port, token = free_port(), "minicpmo-test-token"
    bogus = tmp_path / "no-such-checkpoint"
    log = tmp_path / "worker.log"
    cmd = [sys.executable, "-m", "omnilive", "worker", "--engine", "minicpmo", "--model-path",
           str(bogus), "--port", str(port), "--data-dir", str(tmp_path / "data")]  # fmt: skip
    env = {**os.environ, "OMNILIVE_INTERNAL_TOKEN": token}
    with open(log, "wb") as out:
        worker = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        health = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            try:
                health = httpx.get(
                    f"http://127.0.0.1:{port}/health",
                    headers={"authorization": f"Bearer {token}"},
                    timeout=2,
                ).json()
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if health["worker_status"] != "loading":
                break
            time.sleep(0.1)
        assert health is not None, log.read_text()
        assert health["worker_status"] == "error" and health["model_loaded"] is False
        assert health["engine"] == "minicpmo"
        assert health["error"] == f"CheckpointError: checkpoint directory {bogus} does not exist"
        assert health["capabilities"]["audio_output"] is True
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=15)
