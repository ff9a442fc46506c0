"""``omnilive serve | gateway | worker | cleanup``: load settings once, start processes."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from omnilive.client import talk
from omnilive.config import Settings, load_settings
from omnilive.engines.registry import ENGINE_NAMES
from omnilive.gateway.supervisor import SETTINGS_ENV, worker_sockets
from omnilive.logs import configure_logging
from omnilive.protocol.common import describe_validation_error
from omnilive.protocol.internal import LISTEN_FD_ENV, REPORT_FD_ENV, LoadOutcome, LoadReport
from omnilive.recording import cleanup as recording_cleanup
from omnilive.serving import (
    ExitCode,
    MediaSocket,
    ProcessExit,
    StartupError,
    http_url,
    listen_socket,
    run_server,
    write_port_file,
)

if TYPE_CHECKING:
    from omnilive.tls import Certificate

INSECURE_HELP = "allow an open gateway (no API keys) on a non-loopback address"
PORT_FILE_HELP = (
    "once listening, write the address as JSON to this file ({url, port}; serve adds its "
    "workers' URLs): how whoever started it with --port 0 learns the port"
)
log = logging.getLogger("omnilive.cli")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--engine", choices=ENGINE_NAMES, help="engine the workers load")
    parser.add_argument("--data-dir", type=Path, help="recordings, caches and state")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="how much to log"
    )
    parser.add_argument("--model-path", type=Path, help="checkpoint directory (minicpmo)")
    parser.add_argument("--port-file", type=Path, metavar="PATH", help=PORT_FILE_HELP)


def _tls_options(parser: argparse.ArgumentParser) -> None:
    """HTTPS and WSS on the gateway's port (its links to workers stay plain, on loopback)."""
    parser.add_argument("--ssl-certfile", type=Path, help="PEM certificate: serve HTTPS and WSS")
    parser.add_argument("--ssl-keyfile", type=Path, help="PEM private key of --ssl-certfile")
    parser.add_argument(
        "--ssl-self-signed",
        action="store_true",
        default=None,
        help="serve HTTPS with a self-signed certificate kept in DATA_DIR/tls (browsers warn)",
    )


def _ray_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--ray [ADDRESS]``: the deployment on a Ray cluster (the ``[ray]`` extra)."""
    parser.add_argument("--ray", nargs="?", const="", metavar="ADDRESS", help=what)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnilive", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="gateway plus N supervised workers")
    _common(serve)
    _tls_options(serve)
    serve.add_argument("--host", help="address the gateway binds")
    serve.add_argument("--port", type=int, help="port of the gateway (0: any free port)")
    serve.add_argument("--workers", type=int, help="worker processes to start")
    serve.add_argument(
        "--worker-base-port",
        type=int,
        help="worker k listens on this port + k (0: each on any free port)",
    )
    serve.add_argument("--insecure", action="store_true", default=None, help=INSECURE_HELP)
    _ray_option(
        serve,
        "run the workers as actors of the Ray cluster at ADDRESS (host:port of its head, or "
        "auto), one per GPU, or --workers N on CPUs; without ADDRESS, start a local cluster",
    )

    gateway = commands.add_parser("gateway", help="the gateway alone, in front of --worker URLs")
    _common(gateway)
    _tls_options(gateway)
    gateway.add_argument("--host", help="address the gateway binds")
    gateway.add_argument("--port", type=int, help="port of the gateway (0: any free port)")
    gateway.add_argument(
        "--worker",
        action="append",
        dest="worker_urls",
        metavar="URL",
        help="a worker to use (repeat for each)",
    )
    gateway.add_argument("--insecure", action="store_true", default=None, help=INSECURE_HELP)
    _ray_option(
        gateway,
        "one more gateway of the deployment that `serve --ray` runs on the Ray cluster at "
        "ADDRESS (default: auto, the cluster this machine belongs to)",
    )

    worker = commands.add_parser("worker", help="one worker process")
    _common(worker)
    worker.add_argument("--host", dest="worker_host", help="address the worker binds")
    worker.add_argument(
        "--port", type=int, dest="worker_port", help="port of the worker (0: any free port)"
    )
    worker.add_argument("--worker-id", default="w0", help="its name in the gateway's pool")

    cleanup = commands.add_parser("cleanup", help="delete recordings by age, then total size")
    recording_cleanup.add_arguments(cleanup)

    talking = commands.add_parser("talk", help="talk with a running server (microphone or files)")
    talk.add_arguments(talking)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = ["engine", "data_dir", "log_level", "host", "port", "workers", "worker_base_port"]
    found = {name: getattr(args, name, None) for name in names}
    found["worker_urls"] = getattr(args, "worker_urls", None)
    found["worker_host"] = getattr(args, "worker_host", None)
    found["minicpmo.model_path"] = args.model_path
    found["auth.insecure"] = getattr(args, "insecure", None)
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_self_signed"):
        found[name] = getattr(args, name, None)
    ray = getattr(args, "ray", None)
    if ray is not None:
        found["ray.enabled"] = True
        found["ray.address"] = ray or None  # without ADDRESS: the configured one
    return found


def resolve_settings(args: argparse.Namespace, environ: dict[str, str]) -> Settings:
    """A worker started by ``serve`` takes the gateway's resolved settings as
    they are; everything else merges file, environment and flags."""
    inherited = environ.get(SETTINGS_ENV)
    if inherited:
        return Settings.model_validate_json(inherited)
    return load_settings(args.config, environ, _overrides(args))


def is_loopback_bind(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> str | None:
    """Why the gateway must not start as configured, or None. An open gateway
    (no API keys) stays on loopback unless ``--insecure`` says otherwise."""
    from omnilive.gateway.credentials import KeyRing, KeysFileError

    try:
        keys = KeyRing.from_settings(settings.auth)
    except (KeysFileError, ValueError) as exc:
        return f"bad API keys: {exc}"
    if not keys.open or is_loopback_bind(settings.host):
        return None
    if not settings.auth.insecure:
        return (
            f"no API keys are configured, so the gateway binds loopback only; to listen on "
            f"{settings.host}, configure auth.keys or auth.keys_file, or pass --insecure"
        )
    banner = "!" * 78
    for line in (
        banner,
        f"INSECURE: no API keys, listening on {settings.host}:{settings.port}.",
        "Anyone who can reach this address can use every route, admin routes included.",
        banner,
    ):
        log.warning(line)
    return None


def _settings_problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return f"bad settings: {describe_validation_error(exc)}"
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"bad settings file: {exc}"
    return f"cannot read the settings file: {exc}"


def _report_to_supervisor(environ: dict[str, str]) -> Callable[[LoadReport], None]:
    """Writes the worker's load report on the pipe ``serve`` handed it, if any."""
    fd_text = environ.get(REPORT_FD_ENV, "")
    if not fd_text.isdigit():
        return lambda report: None

    def report(load: LoadReport) -> None:
        with contextlib.suppress(OSError):
            os.write(int(fd_text), load.encode())

    return report


def _worker(args: argparse.Namespace, settings: Settings, environ: dict[str, str]) -> ProcessExit:
    from omnilive.worker.app import create_worker_app

    if not settings.internal_token:
        raise StartupError("set OMNILIVE_INTERNAL_TOKEN (the secret it shares with the gateway)")
    inherited = environ.get(LISTEN_FD_ENV, "")
    if inherited.isdigit():  # started by serve, which bound it
        sock = socket.socket(fileno=int(inherited))
    else:
        port = args.worker_port if args.worker_port is not None else settings.worker_base_port
        sock = listen_socket(settings.worker_host, port)
        if args.port_file is not None:
            write_port_file(args.port_file, http_url(settings.worker_host, sock))
    process_exit = ProcessExit()
    report = _report_to_supervisor(environ)
    engine = settings.engine

    def loaded(load: LoadReport) -> None:
        report(load)
        if load.outcome is LoadOutcome.UNAVAILABLE:
            process_exit.request(ExitCode.ENGINE_UNAVAILABLE, f"engine {engine}: {load.reason}")
        elif load.outcome is LoadOutcome.FAILED:
            reason = f"engine {engine} failed to load: {load.reason}"
            process_exit.request(ExitCode.INTERNAL, reason)

    app = create_worker_app(settings, args.worker_id, on_load=loaded)
    run_server(app, sock, settings.worker_host, settings, process_exit, internal=True)
    return process_exit


def _write_ports(
    path: Path,
    settings: Settings,
    sock: socket.socket,
    workers: list[socket.socket] | None,
    https: bool,
) -> None:
    """``--port-file`` of a gateway: its URL and its supervised workers'."""
    url = http_url(settings.host, sock)
    if https:
        url = "https" + url.removeprefix("http")
    urls = None
    if workers is not None:
        urls = {f"w{k}": http_url(settings.worker_host, w) for k, w in enumerate(workers)}
    write_port_file(path, url, urls)


def _gateway(args: argparse.Namespace, settings: Settings) -> ProcessExit:
    from omnilive.gateway.app import create_app
    from omnilive.tls import TlsError, announce, gateway_certificate

    on_ray = settings.ray.enabled
    if args.command == "serve" and not settings.internal_token:
        settings = settings.model_copy(update={"internal_token": secrets.token_urlsafe(32)})
    if not settings.internal_token and not on_ray:  # on Ray, the deployment's is used
        raise StartupError("set OMNILIVE_INTERNAL_TOKEN (the secret it shares with the workers)")
    refusal = check_exposure(settings)
    if refusal is not None:
        raise StartupError(refusal)
    # TLS does not replace the exposure check above: it hides the traffic,
    # not the routes.
    try:
        tls = gateway_certificate(settings)
    except TlsError as exc:
        raise StartupError(str(exc)) from None
    if tls is not None:
        announce(tls)
    # Bound before any worker starts, as the workers' own: a port in use
    # stops everything at once.
    sock = listen_socket(settings.host, settings.port)
    supervised = worker_sockets(settings) if args.command == "serve" and not on_ray else None
    if args.port_file is not None:
        _write_ports(args.port_file, settings, sock, supervised, https=tls is not None)
    process_exit = ProcessExit()
    media = None
    if settings.webrtc.enabled and settings.webrtc.media_process_count() > 0:
        media = MediaSocket.open(tls=tls is not None)
    try:
        if not on_ray:
            app = create_app(settings, supervised=supervised, process_exit=process_exit,
                             media=media)  # fmt: skip
            run_server(app, sock, settings.host, settings, process_exit, tls=tls, media=media)
            return process_exit
        _on_ray(args, settings, sock, process_exit, tls, media)
    finally:
        if media is not None:
            media.close()
    return process_exit


def _on_ray(
    args: argparse.Namespace,
    settings: Settings,
    sock: socket.socket,
    process_exit: ProcessExit,
    tls: Certificate | None,
    media: MediaSocket | None,
) -> None:
    from omnilive.cluster import ray_api
    from omnilive.cluster.deploy import open_deployment
    from omnilive.gateway.app import create_app

    try:
        settings, cluster = open_deployment(settings, owner=args.command == "serve")
    except StartupError:
        sock.close()
        raise
    try:
        app = create_app(settings, process_exit=process_exit, cluster=cluster, media=media)
        run_server(app, sock, settings.host, settings, process_exit, tls=tls, media=media)
    finally:
        ray_api.leave()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = dict(os.environ)
    if args.command == "cleanup":
        return recording_cleanup.run_cli(args, environ)
    if args.command == "talk":
        return talk.run(args)
    name = f"omnilive {args.command}"
    try:
        settings = resolve_settings(args, environ)
    except (ValidationError, OSError, tomllib.TOMLDecodeError) as exc:
        print(f"{name}: {_settings_problem(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    configure_logging(settings.log_level, args.command, settings.log_json, settings.log_stream)
    supervised = args.command == "worker" and bool(environ.get(REPORT_FD_ENV))
    try:
        if args.command == "worker":
            ended = _worker(args, settings, environ)
        else:
            ended = _gateway(args, settings)
    except StartupError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exc.code
    # A supervised worker's reason reaches the user through ``serve``.
    if ended.reason is not None and not supervised:
        print(f"{name}: {ended.reason}", file=sys.stderr)
    return ended.code


if __name__ == "__main__":
    sys.exit(main())
