"""The container check: the cpu image, built from the checkout by ``podman
build``, runs ``omnilive serve`` (``buildah run``) and holds real sessions with
the embedded engine from outside the container, then stops on SIGTERM.

The first run on a machine makes the base image (debootstrap, ~30 s) and
every layer; later runs rebuild only what changed (a change to src/ rebuilds
the last, small layer). The figures measured go to
tests/artifacts/container-check.json (docs/operating/containers.md quotes them).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.audio_files import encoded
from tests.clients import open_client, spoken_turn
from tests.container import images
from tests.servers import OnLocalPort, chat_once, free_port, user

pytestmark = [
    pytest.mark.cascade,
    pytest.mark.skipif(
        shutil.which("podman") is None and shutil.which("buildah") is None,
        reason="no container tool (podman, buildah) on this machine",
    ),
]
TAG = "localhost/omnilive:cpu-check"
ARTIFACTS = images.REPO / "tests" / "artifacts"
READY_TIMEOUT_S = 240.0
QUESTION = "What is the capital of France?"


@dataclass
class Served(OnLocalPort):
    """``omnilive serve`` in a container, as the test clients address a server."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    figures: dict = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


def _record(figures: dict) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "container-check.json").write_text(json.dumps(figures, indent=2) + "\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The cpu image from a copy of the checkout, with what building it took."""
    assert images.container_tool(), "the check needs both podman and buildah"
    work = tmp_path_factory.mktemp("container")
    figures: dict = {}
    with images.machine_lock():
        base = images.base_image_name()
        if not images.image_exists(base):
            started = time.monotonic()
            images.make_debian_base(base, work / "debootstrap.log")
            figures["base_image_s"] = round(time.monotonic() - started, 1)
        context = images.tracked_tree(work / "tree")
        build = images.build_image(context, "cpu", TAG, work / "build.log")
    figures["build_s"] = round(build.seconds, 1)
    figures["image_bytes"] = images.image_size_bytes(TAG)
    figures["base_image_bytes"] = images.image_size_bytes(base)
    yield figures
    _record(figures)


@pytest.fixture(scope="module")
def container(built: dict) -> Iterator[images.Container]:
    made = images.Container(TAG)
    try:
        yield made
    finally:
        made.remove()


async def _until_up(served: Served, path: str, ready: bool) -> float:
    """Seconds until ``path`` answers 200 (and, for /status, a worker is idle)."""
    started = time.monotonic()
    async with httpx.AsyncClient() as client:
        while time.monotonic() - started < READY_TIMEOUT_S:
            assert served.process.poll() is None, served.log()
            try:
                response = await client.get(served.http + path, timeout=2)
                idle = not ready or response.json()["workers"]["by_state"].get("idle", 0) >= 1
                if response.status_code == 200 and idle:
                    return time.monotonic() - started
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{path} did not answer in {READY_TIMEOUT_S} s:\n{served.log()}")


@pytest.fixture(scope="module")
def served(container: images.Container, built: dict, tmp_path_factory) -> Iterator[Served]:
    """``omnilive serve`` started in the image, on a free port of the host's network."""
    port = free_port()
    log = tmp_path_factory.mktemp("served") / "serve.log"
    # The image's command with the address this test can use: the host's
    # network has other servers on it, so loopback and a free port, and the
    # worker on any free port.
    command = ["omnilive", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--worker-base-port", "0"]
    started = time.monotonic()
    process = container.run(command, {"OMNILIVE_PORT": str(port)}, log)
    served = Served(port, process, log, built)
    try:
        built["health_s"] = round(asyncio.run(_until_up(served, "/health", ready=False)), 2)
        asyncio.run(_until_up(served, "/status", ready=True))
        built["ready_s"] = round(time.monotonic() - started, 2)
        yield served
    finally:
        images.stop_group(process)


def test_the_image_runs_unprivileged_with_a_health_check(built: dict) -> None:
    config = images.image_config(TAG)
    assert config["User"] == "omnilive"
    assert config["Entrypoint"] == ["omnilive"] and config["Cmd"] == ["serve"]
    assert "/data" in config["Volumes"]
    assert config["Healthcheck"]["Test"][0] == "CMD"
    assert "OMNILIVE_DATA_DIR=/data" in config["Env"]
    # The compilers stayed in the build stages.
    assert built["image_bytes"] < 2_000_000_000, built


def test_the_health_check_passes_in_the_container(served: Served, container) -> None:
    test = images.image_config(TAG)["Healthcheck"]["Test"][1:]
    done = container.call(test, {"OMNILIVE_PORT": str(served.port)})
    assert done.returncode == 0, done.stderr
    closed = container.call(test, {"OMNILIVE_PORT": str(free_port())})
    assert closed.returncode == 1 and "refused" in closed.stderr.lower(), closed.stderr


def test_an_open_gateway_on_every_address_stops_in_one_line(container) -> None:
    """The image listens on every address: with no API keys and no
    auth.insecure, ``serve`` refuses at once, with its one line and exit 2."""
    done = container.call(["omnilive", "serve", "--port", str(free_port())], {})
    said = [line for line in done.stderr.splitlines() if line.startswith("omnilive serve:")]
    assert done.returncode == 2, done.stderr
    assert len(said) == 1 and "no API keys" in said[0], done.stderr
    assert "Traceback" not in done.stderr


async def test_a_chat_turn_is_answered_with_speech(served: Served) -> None:
    messages = await chat_once(served, user("Say hello in one short sentence."), timeout=90)
    done = messages[-1]
    assert done["type"] == "done" and done["text"].strip(), messages[-3:]
    audio = [m["audio_data"] for m in messages if m.get("audio_data")]
    assert audio, "the answer was spoken"


async def test_a_half_duplex_turn_hears_the_question(served: Served) -> None:
    client = await open_client(served)
    done, chunks = await spoken_turn(client, QUESTION, timeout=90)
    assert done["turn_index"] == 0 and done["text"].strip()
    assert chunks, "the answer was spoken"
    await client.send({"type": "stop"})
    await client.until("stopped")
    await client.ws.close()


async def test_an_uploaded_voice_is_decoded_by_the_images_ffmpeg(served: Served) -> None:
    tone = (0.3 * np.sin(np.linspace(0, 2 * np.pi * 220 * 2.0, 32000))).astype(np.float32)
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{served.http}/api/assets/ref_audio",
            files={"file": ("v.mp3", encoded(tone, "mp3"))},
            data={"name": "container"},
            timeout=30,
        )
    assert response.status_code == 201, response.text


async def test_sigterm_ends_sessions_and_stops_the_server(served: Served, built: dict) -> None:
    """Last: the server's end. A session held open hears ``server_shutdown``
    and the process exits 0. ``docker stop`` signals the container's first
    process; so does this test (images.main_process says why not buildah's)."""
    client = await open_client(served)
    await client.prepare("Answer in one short sentence.")
    main = images.main_process(served.process, "/opt/omnilive/bin/omnilive")
    assert main is not None, "no omnilive process under buildah run"
    started = time.monotonic()
    os.kill(main, signal.SIGTERM)
    ended = await client.until("error", timeout=30)
    assert ended["code"] == "server_shutdown", ended
    code = await asyncio.to_thread(served.process.wait, 30)
    built["sigterm_to_exit_s"] = round(time.monotonic() - started, 2)
    assert code == 0, served.log()
    assert "Traceback" not in served.log()
