"""Start-up failures with real processes: each ends in one clear line on
stderr and the exit status docs/operating/startup.md documents, never a traceback for an
expected problem and never a server that runs on without being able to serve."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from omnilive.serving import ExitCode
from tests.servers import Server, chat_once, free_port, user

TIMEOUT_S = 90


def omnilive(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``omnilive ARGS`` to its end (it must end by itself)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMNILIVE_")}
    environ.update({"OMNILIVE_RESTART_BACKOFF_MAX_S": "0.5", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "omnilive", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=TIMEOUT_S,
    )


def serve_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "serve", "--port", "0", "--worker-base-port", "0",
        "--data-dir", str(tmp_path / "data"), *extra,
    ]  # fmt: skip


def last_line(run: subprocess.CompletedProcess[str]) -> str:
    lines = run.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def worker_starts(run: subprocess.CompletedProcess[str]) -> int:
    return len(re.findall(r"worker w0 started \(pid", run.stderr))


def test_worker_without_internal_token(tmp_path: Path) -> None:
    run = omnilive(tmp_path, "worker", "--engine", "scripted", "--port", str(free_port()))
    assert run.returncode == ExitCode.USAGE
    assert run.stderr.strip() == (
        "omnilive worker: set OMNILIVE_INTERNAL_TOKEN (the secret it shares with the gateway)"
    )


def test_gateway_without_internal_token(tmp_path: Path) -> None:
    run = omnilive(tmp_path, "gateway", "--port", str(free_port()), "--worker", "http://x:1")
    assert run.returncode == ExitCode.USAGE
    assert run.stderr.strip().startswith("omnilive gateway: set OMNILIVE_INTERNAL_TOKEN")


def test_bad_settings_are_one_line(tmp_path: Path) -> None:
    run = omnilive(tmp_path, "serve", env={"OMNILIVE_PORT": "eighty"})
    assert run.returncode == ExitCode.USAGE
    assert run.stderr.strip().startswith("omnilive serve: bad settings: port:")
    assert "Traceback" not in run.stderr
    missing = omnilive(tmp_path, "serve", "--config", str(tmp_path / "absent.toml"))
    assert missing.returncode == ExitCode.USAGE
    assert "cannot read the settings file" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = omnilive(tmp_path, "serve", "--engine", "scripted", "--port", str(port))
    assert run.returncode == ExitCode.USAGE
    assert run.stderr.strip() == (
        f"omnilive serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_a_worker_port_in_use_stops_serve_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = omnilive(
            tmp_path,
            *["serve", "--engine", "scripted", "--port", "0", "--worker-base-port", str(port)],
        )
    assert run.returncode == ExitCode.USAGE
    assert last_line(run) == (
        f"omnilive serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert worker_starts(run) == 0


async def test_port_file_names_the_ports_chosen_for_port_0(tmp_path: Path) -> None:
    """``--port 0 --worker-base-port 0``: the system picks every port, and the
    port file says which (the gateway's, each worker's); a worker that is
    restarted keeps its port."""
    server = Server(tmp_path, workers=2).start()
    try:
        await server.wait_ready(workers=2)
        ports = json.loads(server.port_file.read_text())
        assert ports["url"] == f"http://127.0.0.1:{ports['port']}" and ports["port"] > 0
        workers = (await server.get("/workers"))["workers"]
        assert ports["workers"] == {w["worker_id"]: w["url"] for w in workers}
        assert len({ports["port"], *(w["port"] for w in workers)}) == 3
        os.kill(workers[0]["pid"], signal.SIGKILL)
        async with asyncio.timeout(30):
            while True:
                again = (await server.get("/workers"))["workers"][0]
                if again["restarts"] == 1 and again["status"] == "idle":
                    break
                await asyncio.sleep(0.1)
        assert again["url"] == workers[0]["url"]
        assert (await chat_once(server, user("Still there?")))[-1]["type"] == "done"
    finally:
        server.stop()


def test_a_standalone_worker_on_port_0_writes_its_port_file(tmp_path: Path) -> None:
    port_file = tmp_path / "worker.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNILIVE_")}
    env["OMNILIVE_INTERNAL_TOKEN"] = "t" * 32
    args = ["worker", "--engine", "scripted", "--port", "0", "--port-file", str(port_file)]
    process = subprocess.Popen(
        [sys.executable, "-m", "omnilive", *args],
        stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "Application startup complete" in line:
                break
        ports = json.loads(port_file.read_text())
        assert set(ports) == {"url", "port"}
        health = httpx.get(
            f"{ports['url']}/health", headers={"Authorization": "Bearer " + "t" * 32}
        )
        assert health.status_code == 200
    finally:
        process.terminate()
        process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0


def test_missing_checkpoint_stops_serve_without_restarts(tmp_path: Path) -> None:
    run = omnilive(
        tmp_path, *serve_args(tmp_path, "--engine", "minicpmo", "--model-path", "/nonexistent")
    )
    assert run.returncode == ExitCode.ENGINE_UNAVAILABLE, run.stderr[-3000:]
    assert last_line(run) == (
        "omnilive serve: no worker can serve: worker w0 cannot load its engine: "
        "checkpoint directory /nonexistent does not exist"
    )
    assert "Traceback" not in run.stderr
    assert worker_starts(run) == 1  # a configuration problem is not retried


def test_standalone_worker_with_missing_checkpoint_exits(tmp_path: Path) -> None:
    run = omnilive(
        tmp_path,
        *["worker", "--engine", "minicpmo", "--model-path", "/nonexistent"],
        *["--port", str(free_port())],
        env={"OMNILIVE_INTERNAL_TOKEN": "t" * 32},
    )
    assert run.returncode == ExitCode.ENGINE_UNAVAILABLE
    assert last_line(run) == (
        "omnilive worker: engine minicpmo: checkpoint directory /nonexistent does not exist"
    )
    assert "Traceback" not in run.stderr


def test_worker_crashing_during_load_is_given_up(tmp_path: Path) -> None:
    run = omnilive(
        tmp_path,
        *serve_args(tmp_path, "--engine", "scripted"),
        env={"OMNILIVE_SCRIPTED__LOAD_FAULT": "crash", "OMNILIVE_MAX_FAILED_LOADS": "3"},
    )
    assert run.returncode == ExitCode.WORKERS_FAILED, run.stderr[-3000:]
    assert "worker w0 died during load: signal 11 (SIGSEGV); restarting in" in run.stderr
    assert last_line(run) == (
        "omnilive serve: no worker can serve: "
        "worker w0 died during load: signal 11 (SIGSEGV), 3 loads in a row"
    )
    assert worker_starts(run) == 3
    assert "Traceback" not in run.stderr


def test_worker_failing_with_a_bug_is_retried_then_given_up(tmp_path: Path) -> None:
    run = omnilive(
        tmp_path,
        *serve_args(tmp_path, "--engine", "scripted"),
        env={"OMNILIVE_SCRIPTED__LOAD_FAULT": "error", "OMNILIVE_MAX_FAILED_LOADS": "2"},
    )
    assert run.returncode == ExitCode.WORKERS_FAILED
    assert last_line(run) == (
        "omnilive serve: no worker can serve: worker w0 died during load: "
        "RuntimeError: scripted load fault: a bug while loading, 2 loads in a row"
    )
    assert worker_starts(run) == 2


async def test_worker_that_crashes_twice_then_loads_serves(tmp_path: Path) -> None:
    server = Server(
        tmp_path,
        env={
            "OMNILIVE_SCRIPTED__LOAD_FAULT": "crash",
            "OMNILIVE_SCRIPTED__LOAD_FAULTS": "2",
            "OMNILIVE_MAX_FAILED_LOADS": "3",
        },
    ).start()
    try:
        await server.wait_ready(timeout=60)
        [worker] = (await server.get("/workers"))["workers"]
        assert worker["status"] == "idle"
        assert worker["restarts"] == 2
        log = server.log_path.read_text()
        assert log.count("died during load: signal 11 (SIGSEGV)") == 2
    finally:
        server.stop()
    assert server.process is not None and server.process.returncode == 0


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_sigterm_is_a_clean_exit(tmp_path: Path, command: str) -> None:
    """The codes above mean something only if a normal stop is 0."""
    args = serve_args(tmp_path, "--engine", "scripted")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNILIVE_")}
    if command == "worker":
        args = ["worker", "--engine", "scripted", "--port", str(free_port())]
        env["OMNILIVE_INTERNAL_TOKEN"] = "t" * 32
    process = subprocess.Popen(
        [sys.executable, "-m", "omnilive", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert process.stderr is not None
    for line in process.stderr:
        if "Application startup complete" in line:
            break
    process.terminate()
    _, rest = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0, rest


async def test_a_gateway_without_aiortc_serves_and_refuses_webrtc_calls(tmp_path: Path) -> None:
    """A GPU machine set up without aiortc or PyAV: one line in the log, the
    WebSocket serves, a WebRTC offer is refused with its own code, and the
    pages are told WebRTC is off (they use the WebSocket)."""
    hidden = tmp_path / "hidden"
    (hidden / "aiortc").mkdir(parents=True)
    (hidden / "aiortc" / "__init__.py").write_text('raise ImportError("not installed here")\n')
    path = os.pathsep.join(p for p in (str(hidden), os.environ.get("PYTHONPATH")) if p)
    server = Server(tmp_path, env={"PYTHONPATH": path}).start()
    try:
        await server.wait_ready(timeout=60, workers=1)
        assert (await server.get("/api/webrtc/config"))["enabled"] is False
        async with httpx.AsyncClient(base_url=server.http) as http:
            offer = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
            refused = await http.post(
                "/v1/realtime/calls", content=offer, headers={"content-type": "application/sdp"}
            )
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "webrtc_unavailable"
        answer = await chat_once(server, user("Say hello."))
        assert answer[-1]["type"] == "done"
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "WebRTC is off: aiortc cannot be imported" in log and "Traceback" not in log


def test_log_stream_stdout_puts_every_process_s_log_on_stdout(tmp_path: Path) -> None:
    """A container's log is its output: with ``log_stream = "stdout"`` the
    gateway's and its worker's lines go there and stderr stays empty."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNILIVE_")}
    env["OMNILIVE_LOG_STREAM"] = "stdout"
    process = subprocess.Popen(
        [sys.executable, "-m", "omnilive", *serve_args(tmp_path, "--engine", "scripted")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert process.stdout is not None
    watchdog = threading.Timer(TIMEOUT_S, process.kill)  # no such line: the loop ends
    watchdog.start()
    seen: list[str] = []
    for line in process.stdout:
        seen.append(line)
        if "[worker]" in line and "Application startup complete" in line:
            break
    watchdog.cancel()
    process.terminate()
    _, errors = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0, errors
    assert any("[serve]" in line and "worker w0 started" in line for line in seen)
    assert errors == ""
