"""Real omnilive processes on ephemeral ports, for integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect

REPO = Path(__file__).resolve().parents[1]


# Ports for what cannot bind port 0 itself and report it (a Ray head, a
# port where nobody may listen) come from below Linux's ephemeral range
# (32768-60999 by default), where the kernel picks the local ports of
# outgoing connections and the ports of sockets bound to port 0: a port found
# free there can be taken by another socket before its user binds it. Each
# pytest-xdist worker draws from its own part of the range, so that two test
# processes are never handed one port.
PORT_RANGE = (20000, 32000)
PORT_FILE_TIMEOUT_S = 30.0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _port_range() -> tuple[int, int]:
    """This test process's part of :data:`PORT_RANGE`."""
    low, high = PORT_RANGE
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3"
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.removeprefix("gw").isdigit() or count <= 1:
        return low, high
    size = (high - low) // count
    start = low + int(worker.removeprefix("gw")) * size
    return start, start + size


def free_port_run(n: int) -> int:
    """A base port with ``n`` consecutive free ports, outside the ephemeral range."""
    low, high = _port_range()
    for _ in range(500):
        base = random.randrange(low, high - n)
        if all(_bindable(port) for port in range(base, base + n)):
            return base
    raise RuntimeError("no free port range")


def free_port() -> int:
    return free_port_run(1)


class OnLocalPort:
    """A server on 127.0.0.1 at ``port``: its HTTP and WebSocket bases."""

    port: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


class Server(OnLocalPort):
    """``omnilive serve`` in a subprocess; stopped (and its workers) on exit.

    The gateway and its workers bind port 0 and report the ports the system
    gave them in a port file (``--port-file``); :attr:`port` and
    :attr:`worker_base` read it, waiting for it after :meth:`start`."""

    _started = 0  # numbers the log and port files of servers sharing a folder

    def __init__(
        self,
        tmp: Path,
        engine: str = "scripted",
        workers: int = 1,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        command: str = "serve",
        api_key: str | None = None,
    ) -> None:
        # Sent by wait_ready() and get() when the server has API keys.
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.tmp = tmp
        Server._started += 1
        name = f"server-{os.getpid()}-{Server._started}"
        self.log_path = tmp / f"{name}.log"
        self.port_file = tmp / f"{name}.port.json"
        self._ports: dict[str, Any] | None = None
        self.env = {
            **os.environ,
            "OMNILIVE_HEALTH_INTERVAL_S": "1",
            "OMNILIVE_QUEUE_UPDATE_INTERVAL_S": "0.5",
            "OMNILIVE_RESTART_BACKOFF_MAX_S": "1",
            **(env or {}),
        }
        self.cmd = [
            sys.executable, "-m", "omnilive", command, "--engine", engine,
            "--port", "0", "--port-file", str(self.port_file),
            "--data-dir", str(tmp / "data"), *(args or []),
        ]  # fmt: skip
        if command == "serve":
            self.cmd += ["--workers", str(workers), "--worker-base-port", "0"]
        self.process: subprocess.Popen[bytes] | None = None

    def ports(self, timeout: float = PORT_FILE_TIMEOUT_S) -> dict[str, Any]:
        """The port file, once the server has written it."""
        if self._ports is None:
            deadline = time.monotonic() + timeout
            while not self.port_file.exists():
                assert self.process is not None, "the server is not started"
                assert self.process.poll() is None, self.log()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no port file after {timeout} s:\n{self.log()}")
                time.sleep(0.02)
            self._ports = json.loads(self.port_file.read_text())
        return self._ports

    @property
    def port(self) -> int:
        return int(self.ports()["port"])

    @property
    def worker_base(self) -> int:
        """The port of worker w0."""
        return int(urlsplit(self.ports()["workers"]["w0"]).port or 0)

    def start(self) -> Server:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.tmp
        )
        return self

    async def wait_ready(self, timeout: float = 60.0, workers: int | None = None) -> dict[str, Any]:
        """Until ``/status`` says ready (and ``workers`` idle slots, if given)."""
        deadline = time.monotonic() + timeout
        while not self.port_file.exists():
            assert self.process and self.process.poll() is None, self.log()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no port file:\n{self.log()}")
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                assert self.process and self.process.poll() is None, self.log()
                try:
                    response = await client.get(
                        f"{self.http}/status", headers=self.headers, timeout=2
                    )
                    body = response.json()
                    idle = body["workers"]["by_state"].get("idle", 0)
                    if response.status_code == 200 and (workers is None or idle >= workers):
                        return body
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"server not ready:\n{self.log()}")

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{self.http}{path}", headers=self.headers, timeout=10)
            return response.json()

    async def wait_worker_status(self, status: str, timeout: float = 5.0) -> dict[str, Any]:
        """Worker w0 as ``/workers`` shows it once it reaches ``status``. Its
        state travels on its own control channel, so it may trail what the
        session's socket already said."""
        async with asyncio.timeout(timeout):
            while True:
                worker = (await self.get("/workers"))["workers"][0]
                if worker["status"] == status:
                    return worker
                await asyncio.sleep(0.05)

    async def wait_idle(self, timeout: float = 10.0) -> dict[str, Any]:
        """``/status`` once no session holds a slot, waits in the queue or is
        held suspended for a resume."""
        async with asyncio.timeout(timeout):
            while True:
                status = await self.get("/status")
                busy = status["workers"]["slots_busy"]
                if not busy and not status["queue_length"] and not status["suspended_sessions"]:
                    return status
                await asyncio.sleep(0.1)

    def full_log(self) -> str:
        """Everything the server printed: what a test looks for in it may be
        followed by many access lines (a readiness poll writes ten a second)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log(self) -> str:
        """The log's tail, short enough for a failure message."""
        return self.full_log()[-6000:]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if hasattr(self, "_log"):
            self._log.close()


@contextlib.contextmanager
def running(tmp: Path, ready_timeout: float = 60.0, **options: Any) -> Iterator[Server]:
    """``omnilive serve`` until the block ends (a module's server fixture)."""
    server = Server(tmp, **options).start()
    try:
        asyncio.run(server.wait_ready(timeout=ready_timeout, workers=1))
        yield server
    finally:
        server.stop()


async def chat_once(server: Server, payload: dict[str, Any], timeout: float = 30) -> list[dict]:
    """Run one /ws/chat request; returns every message received."""
    received: list[dict] = []
    async with connect(f"{server.ws}/ws/chat", max_size=None) as ws:
        await ws.send(json.dumps(payload))
        async with asyncio.timeout(timeout):
            async for raw in ws:
                received.append(json.loads(raw))
    return received


async def recv(ws: ClientConnection, timeout: float = 20) -> dict[str, Any]:
    """The next message on ``ws``, parsed (a timeout fails the test)."""
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until(ws: ClientConnection, *types: str, timeout: float = 20) -> dict[str, Any]:
    """The first message on ``ws`` of one of ``types``, those before it skipped."""
    while (message := await recv(ws, timeout))["type"] not in types:
        pass
    return message


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}
