"""Running a gateway or a worker under uvicorn, and how such a process ends.

A process that cannot serve says why on one line and exits with a code that
tells what kind of problem it was (:class:`ExitCode`): an expected problem
(a port in use, a missing checkpoint, a worker that keeps crashing while it
loads) never ends in a Python traceback, and a server that can no longer
serve anyone stops instead of running on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from omnilive.config import Settings
from omnilive.header_deadline import http_protocol
from omnilive.protocol.internal import SESSION_PING_INTERVAL_S

if TYPE_CHECKING:
    from omnilive.tls import Certificate

log = logging.getLogger(__name__)

# uvicorn refuses larger frames outright (close 1009); below it, omnilive
# answers an oversize message with a ``payload_too_large`` error instead.
WS_FRAME_MARGIN = 1024 * 1024
SHUTDOWN_GRACE_S = 5.0
LISTEN_BACKLOG = 2048  # uvicorn's own default


class ExitCode(IntEnum):
    """What an ``omnilive`` process's exit status means (docs/operating/startup.md lists them)."""

    OK = 0
    INTERNAL = 1  # an unexpected error: a bug, with its traceback in the log
    USAGE = 2  # bad arguments, settings or keys, or an address that cannot be bound
    ENGINE_UNAVAILABLE = 3  # the engine cannot load as configured; starting again will not help
    WORKERS_FAILED = 4  # ``serve``: every worker kept dying while it loaded


class StartupError(Exception):
    """An expected problem that keeps a process from serving: its message is
    the one line the user sees, its code the exit status."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code


class ProcessExit:
    """How this process ends. The first part of the program that decides the
    process must stop (a worker whose engine failed, a gateway with no worker
    left) records why here, then the server shuts down gracefully."""

    def __init__(self) -> None:
        self.code = ExitCode.OK
        self.reason: str | None = None
        self._stop: Callable[[], None] | None = None

    def request(self, code: ExitCode, reason: str) -> None:
        if self.reason is None:
            self.code, self.reason = code, reason
        if self._stop is not None:
            self._stop()

    def bind_server(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        if self.reason is not None:
            stop()


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: one the system picks),
    or a :class:`StartupError` saying why not.

    Bound here rather than by uvicorn, which logs a bind failure and calls
    ``sys.exit`` from inside the server. It listens at once, so that a port
    reported as soon as it is bound (:func:`write_port_file`) takes
    connections: they wait in the backlog until the server serves."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(LISTEN_BACKLOG)
    return sock


@dataclass
class MediaSocket:
    """The gateway's internal Unix socket, in a folder only its user can
    enter: where its WebRTC media processes open their calls' sessions
    (``docs/webrtc.md``). The gateway serves it beside its public port, with
    the same app (and the same TLS, where it has one)."""

    sock: socket.socket
    path: str
    tls: bool = False

    @classmethod
    def open(cls, tls: bool = False) -> MediaSocket:
        folder = tempfile.mkdtemp(prefix="omnilive-media-")  # mode 0700
        path = os.path.join(folder, "gateway.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise StartupError(f"cannot listen on the media processes' socket: {exc}") from None
        return cls(sock, path, tls)

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


def http_url(host: str, sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (its port as bound: port 0 is
    the one the system picked)."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def write_port_file(path: Path, url: str, workers: dict[str, str] | None = None) -> None:
    """``--port-file``: where this process listens, as JSON (``url``,
    ``port``, and ``workers``: each supervised worker's URL), written whole
    at once (a reader never sees half of it). A test or a process manager
    that started it on port 0 learns the port from here."""
    body: dict[str, Any] = {"url": url, "port": urlsplit(url).port}
    if workers is not None:
        body["workers"] = workers
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(json.dumps(body) + "\n")
        partial.replace(path)
    except OSError as exc:
        raise StartupError(f"cannot write the port file {path}: {exc.strerror}") from None


def _already_handled(signum: int, frame: Any) -> None:
    """uvicorn's re-raise of the signal it stopped on, after a graceful stop."""


def run_server(
    app: Any,
    sock: socket.socket,
    host: str,
    settings: Settings,
    process_exit: ProcessExit,
    tls: Certificate | None = None,
    internal: bool = False,
    media: MediaSocket | None = None,
) -> None:
    """Serve ``app`` on ``sock`` until a signal or ``process_exit`` stops it;
    ``process_exit`` then holds the exit status. With ``tls`` (the gateway's
    public port only) it serves HTTPS and WSS. ``internal``: a worker's API,
    whose sockets carry no keepalive pings (``protocol/internal.py``).
    ``media``: the gateway's internal socket, served beside ``sock``."""
    import uvicorn

    from omnilive.ws_protocol import LossAwareWebSocketProtocol

    class GracefulServer(uvicorn.Server):
        """Before uvicorn closes connections, let sessions say goodbye in their
        own protocol (e.g. ``session.closed{server_shutdown}``)."""

        async def shutdown(self, sockets: Any = None) -> None:
            gateway = getattr(app.state, "gateway", None)
            if gateway is not None:
                await gateway.drain(SHUTDOWN_GRACE_S)
            await super().shutdown(sockets)

    options: dict[str, Any] = dict(tls.uvicorn_kwargs()) if tls is not None else {}
    if internal:
        options["ws_ping_interval"] = SESSION_PING_INTERVAL_S
    config = uvicorn.Config(
        app,
        host=host,
        port=sock.getsockname()[1],
        log_level=settings.log_level,
        ws_max_size=settings.limits.max_message_bytes + WS_FRAME_MARGIN,
        ws_per_message_deflate=settings.ws_compression,
        http=http_protocol(settings.limits.header_timeout_s),
        ws=LossAwareWebSocketProtocol,
        lifespan="on",
        timeout_graceful_shutdown=10,
        log_config=None,  # uvicorn's records go through ours (session ids, JSON lines)
        **options,
    )
    server = GracefulServer(config)

    def stop() -> None:
        server.should_exit = True

    process_exit.bind_server(stop)
    # uvicorn handles SIGINT and SIGTERM itself, then re-raises the signal once
    # it has shut down: under Python's own handlers that is a KeyboardInterrupt
    # traceback or death by signal. A stop that was asked for is a clean exit.
    stopping_signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _already_handled) for sig in stopping_signals}
    try:
        server.run(sockets=[sock] if media is None else [sock, media.sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if process_exit.reason is None and not server.started:
        # uvicorn gave up during start-up (the app's lifespan failed) and logged why.
        process_exit.code = ExitCode.INTERNAL
