"""``omnilive serve | gateway | worker | cleanup``: load settings once, start processes."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from omnilive.config import Settings, load_settings
from omnilive.gateway.supervisor import SETTINGS_ENV
from omnilive.logs import configure_logging
from omnilive.recording import cleanup as recording_cleanup

# uvicorn refuses larger frames outright (close 1009); below it, omnilive
# answers an oversize message with a ``payload_too_large`` error instead.
WS_FRAME_MARGIN = 1024 * 1024
INSECURE_HELP = "allow an open gateway (no API keys) on a non-loopback address"
log = logging.getLogger("omnilive.cli")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--engine", choices=["cascade", "scripted", "minicpmo"])
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--model-path", type=Path, help="checkpoint directory (minicpmo)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnilive", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="gateway plus N supervised workers")
    _common(serve)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)
    serve.add_argument("--worker-base-port", type=int)
    serve.add_argument("--insecure", action="store_true", default=None, help=INSECURE_HELP)

    gateway = commands.add_parser("gateway", help="the gateway alone, in front of --worker URLs")
    _common(gateway)
    gateway.add_argument("--host")
    gateway.add_argument("--port", type=int)
    gateway.add_argument("--worker", action="append", dest="worker_urls", metavar="URL")
    gateway.add_argument("--insecure", action="store_true", default=None, help=INSECURE_HELP)

    worker = commands.add_parser("worker", help="one worker process")
    _common(worker)
    worker.add_argument("--host", dest="worker_host")
    worker.add_argument("--port", type=int, dest="worker_port")
    worker.add_argument("--worker-id", default="w0")

    cleanup = commands.add_parser("cleanup", help="delete recordings by age, then total size")
    recording_cleanup.add_arguments(cleanup)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    names = ["engine", "data_dir", "log_level", "host", "port", "workers", "worker_base_port"]
    found = {name: getattr(args, name, None) for name in names}
    found["worker_urls"] = getattr(args, "worker_urls", None)
    found["worker_host"] = getattr(args, "worker_host", None)
    found["minicpmo.model_path"] = args.model_path
    found["auth.insecure"] = getattr(args, "insecure", None)
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


SHUTDOWN_GRACE_S = 5.0


def _run(app: Any, host: str, port: int, settings: Settings) -> None:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """Before uvicorn closes connections, let sessions say goodbye in their
        own protocol (e.g. ``session.closed{server_shutdown}``)."""

        async def shutdown(self, sockets: Any = None) -> None:
            gateway = getattr(app.state, "gateway", None)
            if gateway is not None:
                await gateway.drain(SHUTDOWN_GRACE_S)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=settings.log_level,
        ws_max_size=settings.limits.max_message_bytes + WS_FRAME_MARGIN,
        lifespan="on",
        timeout_graceful_shutdown=10,
        log_config=None,  # uvicorn's records go through ours (session ids, JSON lines)
    )
    GracefulServer(config).run()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    environ = dict(os.environ)
    if args.command == "cleanup":
        return recording_cleanup.run_cli(args, environ)
    settings = resolve_settings(args, environ)
    configure_logging(settings.log_level, args.command, settings.log_json)
    if args.command == "worker":
        from omnilive.worker.app import create_worker_app

        port = args.worker_port if args.worker_port is not None else settings.worker_base_port
        app = create_worker_app(settings, args.worker_id)
        _run(app, settings.worker_host, port, settings)
        return 0

    from omnilive.gateway.app import create_app

    if args.command == "serve" and not settings.internal_token:
        settings = settings.model_copy(update={"internal_token": secrets.token_urlsafe(32)})
    if not settings.internal_token:
        print("omnilive gateway: set OMNILIVE_INTERNAL_TOKEN (shared with the workers)",
              file=sys.stderr)  # fmt: skip
        return 2
    refusal = check_exposure(settings)
    if refusal is not None:
        print(f"omnilive {args.command}: {refusal}", file=sys.stderr)
        return 2
    app = create_app(settings, supervise=args.command == "serve")
    _run(app, settings.host, settings.port, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
