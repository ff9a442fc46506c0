"""The one door to Ray: imported lazily, joined once per process, and every
expected problem (Ray missing, a cluster that cannot be reached or refuses
our token) turned into one line and an exit status."""

from __future__ import annotations

import logging
import math
import os
import socket
from types import ModuleType
from typing import Any

from omnilive.config import Settings
from omnilive.serving import StartupError

log = logging.getLogger(__name__)

REGISTRY_NAME = "registry"
PROBE_TIMEOUT_S = 5.0
JOIN_RETRIES = 10
INSTALL_HINT = "pip install 'omnilive[ray]'"


def import_ray() -> ModuleType:
    """``ray``, or a :class:`StartupError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise StartupError(f"Ray is not installed: {INSTALL_HINT}") from None
    return ray


def worker_actor_name(worker_id: str) -> str:
    return f"worker-{worker_id}"


def first_line(error: BaseException) -> str:
    """The first line of Ray's (often long) messages."""
    return " ".join(str(error).split("\n")[0].split()) or type(error).__name__


def _one_line(exc: BaseException) -> str:
    """Why joining failed, with the hint a missing token needs."""
    chain = f"{exc} {exc.__cause__ or ''}"
    if "InvalidAuthToken" in chain or "AuthenticationError" in chain:
        return "its token is missing or wrong (set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN)"
    return first_line(exc)


def _probe(address: str) -> None:
    """Fail fast where nothing listens: Ray itself retries for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise StartupError(f"bad Ray address {address!r}: expected host:port or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise StartupError(f"cannot join the Ray cluster at {address}: {why}") from None


def join(settings: Settings, start_local: bool) -> str:
    """Connect this process to the cluster of ``settings.ray.address`` (or start a
    local one when that is empty and ``start_local``); returns its address."""
    ray = import_ray()
    address = settings.ray.address
    options: dict[str, Any] = {
        "namespace": settings.ray.namespace,
        "log_to_driver": False,
        "configure_logging": False,
        "include_dashboard": False,
    }
    if not address and not start_local:
        address = "auto"  # the cluster this machine belongs to (RAY_ADDRESS, or `ray start`)
    if not address:
        # A fresh cluster of this process, never one found running on this machine.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        gpus = settings.ray.gpus_per_worker(settings.engine)
        needed = math.ceil(settings.workers * settings.ray.worker_cpus) if not gpus else 0
        options |= {
            "address": "local",
            "num_cpus": max(os.cpu_count() or 1, needed, 1),
            "object_store_memory": settings.ray.object_store_mb * 1024 * 1024,
        }
    else:
        if address != "auto":
            _probe(address)
        # A cluster that answers but never lets us in: a clear error in seconds, not minutes.
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(JOIN_RETRIES))
        options["address"] = address
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise StartupError(f"cannot join {where}: {_one_line(exc)}") from None
    # The address as given (a name for the user), else the one Ray found or made.
    joined: str = address if address not in ("", "auto") else ray.get_runtime_context().gcs_address
    log.info("joined the Ray cluster at %s (namespace %s)", joined, settings.ray.namespace)
    return joined


def leave() -> None:
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()
