"""The container recipe agrees with the rest of the tree, without building it:
the Dockerfile builds llama.cpp and installs the pinned packages exactly as
the Makefile does, compose.yaml's services run commands and settings that
omnilive accepts, and the images' health check tells a serving process from
a dead one (against real servers)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from omnilive.cli import build_parser
from omnilive.config import Settings, load_settings
from tests.container.images import DOCKERFILE, REPO, pip_settings
from tests.servers import Server, free_port

MAKEFILE = (REPO / "Makefile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
HEALTHCHECK = REPO / "container" / "healthcheck.py"


def dockerfile_arg(name: str) -> str:
    match = re.search(rf'^ARG {name}="?([^"\n]*)"?$', DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"the Dockerfile has no ARG {name}"
    return match.group(1)


def make_variable(name: str, occurrence: int = 0) -> str:
    """A Makefile assignment's value, its continuation lines joined as make joins them."""
    found = re.findall(rf"^{name} :?= ((?:.*\\\n)*.*)$", MAKEFILE, re.MULTILINE)
    return " ".join(found[occurrence].replace("\\\n", " ").split())


def test_llama_cpp_is_built_with_the_makefiles_version_and_flags() -> None:
    assert dockerfile_arg("LLAMA_CPP") == make_variable("LLAMA_CPP")
    assert dockerfile_arg("LLAMA_CMAKE_ARGS_X86_64") == make_variable("LLAMA_CMAKE_ARGS", 0)
    assert dockerfile_arg("LLAMA_CMAKE_ARGS_OTHER") == make_variable("LLAMA_CMAKE_ARGS", 1)
    assert make_variable("LLAMA_CPP") in PYPROJECT["project"]["optional-dependencies"]["cascade"]
    # The same cache key as the Makefile's, so that a wheel it built is reused.
    key = 'printf \'%s %s %s\' "$LLAMA_CPP" "$arch" "$flags" | sha256sum | cut -c1-16'
    assert key in DOCKERFILE.read_text()


def test_packages_installed_without_dependencies_are_the_makefiles() -> None:
    makefile = set(re.findall(r"install --no-deps (\S+==\S+)", MAKEFILE))
    dockerfile = set(dockerfile_arg("NO_DEPS_PACKAGES").split())
    dockerfile.add(dockerfile_arg("MINICPMO_UTILS"))
    assert dockerfile == makefile


def test_the_cuda_image_installs_the_cuda_extra_but_minicpmo_utils_dependencies() -> None:
    def name(spec: str) -> str:
        return re.split(r"[<>=\[ ]", spec, maxsplit=1)[0]

    extra = PYPROJECT["project"]["optional-dependencies"]["cuda"]
    listed = dockerfile_arg("CUDA_PACKAGES").split()
    assert {name(s) for s in extra} - {"minicpmo-utils"} <= {name(s) for s in listed}
    pinned = {s for s in extra if "==" in s}
    assert pinned <= set(listed), "the extra's exact pins hold in the image"
    assert dockerfile_arg("MINICPMO_UTILS").split("==")[1] in {"1.0.5", "1.0.6"}


def _setting_exists(variable: str) -> bool:
    model: type[BaseModel] = Settings
    path = variable.removeprefix("OMNILIVE_").lower().split("__")
    for part in path[:-1]:
        field = model.model_fields.get(part)
        if field is None or not isinstance(field.annotation, type):
            return False
        model = field.annotation
    return path[-1] in model.model_fields


def _environment(service: dict) -> dict[str, str]:
    """A service's variables, with compose's ``${NAME:-default}`` as its default."""
    listed = service.get("environment", {})
    if isinstance(listed, list):
        listed = dict(item.partition("=")[::2] for item in listed)
    resolved = {}
    for key, value in listed.items():
        resolved[key] = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value or ""))
    return resolved


SERVICES = COMPOSE["services"]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_runs_a_command_and_settings_omnilive_accepts(name: str) -> None:
    service = SERVICES[name]
    environment = _environment(service)
    unknown = [v for v in environment if v.startswith("OMNILIVE_") and not _setting_exists(v)]
    assert not unknown, f"{name}: no such settings: {unknown}"
    args = build_parser().parse_args(service["command"])
    given = {k: v for k, v in environment.items() if v}
    if args.command == "worker":
        given["OMNILIVE_INTERNAL_TOKEN"] = "t" * 32
    settings = load_settings(None, given, {})
    assert settings.data_dir == Path("data")  # the image sets /data; compose leaves it
    assert service["healthcheck"]["test"][:3] == ["CMD", "python3", "/opt/omnilive-health.py"]
    assert service["profiles"] in (["cpu"], ["gpu"])
    assert service["build"]["target"] in {"cpu", "gateway", "cuda"}
    if args.command == "worker":
        assert service["healthcheck"]["test"][3:] == ["worker"]
        assert settings.worker_base_port == 22400


def test_the_gateway_waits_for_every_worker_and_knows_its_address() -> None:
    workers = {n: s for n, s in SERVICES.items() if s["command"][0] == "worker"}
    gateway = SERVICES["gateway"]
    args = build_parser().parse_args(gateway["command"])
    assert sorted(args.worker_urls) == sorted(f"http://{n}:22400" for n in workers)
    assert gateway["depends_on"] == {n: {"condition": "service_healthy"} for n in workers}
    ids = [build_parser().parse_args(s["command"]).worker_id for s in workers.values()]
    devices = [
        tuple(s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"])
        for s in workers.values()
    ]
    assert len(set(ids)) == len(ids) == len(set(devices)) == len(workers) >= 1
    assert SERVICES["gateway"]["build"]["target"] == "gateway"  # no torch in it


def test_the_cpu_profile_publishes_on_loopback_only() -> None:
    """It runs the open gateway (auth.insecure), so only this machine may reach it."""
    service = SERVICES["omnilive-cpu"]
    assert all(str(p).startswith("127.0.0.1:") for p in service["ports"])
    assert _environment(service)["OMNILIVE_AUTH__INSECURE"] == "true"


def test_the_builds_pip_settings_keep_the_index_and_drop_local_paths() -> None:
    config = "[global]\nfind-links = /opt/wheels\nextra-index-url = file:///opt/x https://m/s\n"
    environ = {"PIP_CERT": "/etc/ca.pem", "PIP_FIND_LINKS": "/opt/wheels"}
    assert pip_settings(environ, config) == {
        "extra-index-url": "https://m/s",
        "cert": "/etc/ca.pem",
    }


def health(role: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNILIVE_")}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), role],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    token = "container-health-" + "t" * 16
    tmp = tmp_path_factory.mktemp("health")
    server = Server(tmp, env={"OMNILIVE_INTERNAL_TOKEN": token}).start()
    server.token = token  # type: ignore[attr-defined]
    try:
        asyncio.run(server.wait_ready(workers=1))
        yield server
    finally:
        server.stop()


def test_the_health_check_passes_on_a_serving_gateway_and_fails_on_a_closed_port(server) -> None:
    assert health("gateway", {"OMNILIVE_PORT": str(server.port)}).returncode == 0
    closed = health("gateway", {"OMNILIVE_PORT": str(free_port())})
    assert closed.returncode == 1 and "refused" in closed.stderr.lower()


def test_the_worker_health_check_needs_the_token_and_a_loaded_engine(server) -> None:
    port = str(server.worker_base)
    good = health(
        "worker", {"OMNILIVE_WORKER_BASE_PORT": port, "OMNILIVE_INTERNAL_TOKEN": server.token}
    )
    assert good.returncode == 0, good.stderr
    wrong = health(
        "worker", {"OMNILIVE_WORKER_BASE_PORT": port, "OMNILIVE_INTERNAL_TOKEN": "x" * 32}
    )
    assert wrong.returncode == 1 and "401" in wrong.stderr
