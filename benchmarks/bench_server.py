"""The server a GPU benchmark runs: ``omnilive serve`` on a checkpoint in a
subprocess, its options and environment, waiting for its worker, and its stop."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(http: str, server: subprocess.Popen[bytes], limit_s: float) -> float:
    started = time.perf_counter()
    async with httpx.AsyncClient() as client:
        while time.perf_counter() - started < limit_s:
            if server.poll() is not None:
                raise RuntimeError("the server exited while loading")
            try:
                body = (await client.get(f"{http}/status", timeout=2)).json()
                if body["workers"]["by_state"].get("idle", 0) >= 1:
                    return time.perf_counter() - started
                if body["workers"]["by_state"].get("error", 0):
                    raise RuntimeError(f"the worker failed to load: {body}")
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(1)
    raise TimeoutError("the server did not become ready")


def start_server(
    args: argparse.Namespace, ckpt: Path, port: int, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Any]:
    log = open(args.log, "wb")  # noqa: SIM115 - closed by bench()
    cmd = [sys.executable, "-m", "omnilive", "serve", "--engine", args.engine,
           "--model-path", str(ckpt), "--port", str(port), "--workers", "1",
           "--worker-base-port", str(free_port()), "--data-dir", str(args.data_dir)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log


def stop_server(server: subprocess.Popen[bytes], log: Any) -> None:
    """SIGTERM, up to 30 s for the sessions to drain, then a kill; the log closed."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def add_server_arguments(parser: argparse.ArgumentParser, log: str, data_dir: str) -> None:
    """The options of the benchmark server :func:`start_server` runs, and the result file."""
    parser.add_argument("--load-timeout", type=float, default=420)
    parser.add_argument("--log", type=Path, default=Path(log))
    parser.add_argument("--data-dir", type=Path, default=Path(data_dir))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--engine", default="minicpmo", help="scripted: try the client logic")


def server_env(ckpt: Path, speak_tokens: int, **settings: str) -> dict[str, str]:
    """The environment of a benchmark's server: the checkpoint's stand-ins on
    the path, its voice, bounded speak units, no recordings, quick health
    checks, and ``settings`` (more ``OMNILIVE_*`` variables)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ckpt / "standin"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "OMNILIVE_MINICPMO__DEFAULT_VOICE": str(ckpt / "voice.wav"),
        "OMNILIVE_MINICPMO__MAX_SPEAK_TOKENS_PER_UNIT": str(speak_tokens),
        "OMNILIVE_RECORDING__ENABLED": "false",
        "OMNILIVE_HEALTH_INTERVAL_S": "2",
        **settings,
    }
