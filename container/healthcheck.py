"""The images' health check: does this container's omnilive answer ``/health``?

``python3 /opt/omnilive-health.py`` probes the gateway (``serve`` or
``gateway``) on ``OMNILIVE_PORT``, over HTTPS when the settings say so;
``... worker`` probes an ``omnilive worker`` on ``OMNILIVE_WORKER_BASE_PORT``
with the internal token, and counts it healthy only once its engine has loaded,
so that a gateway started after it (compose.yaml) finds it ready. Exit 0:
healthy; 1: not, with the reason on stderr (Docker keeps it in the container's
health log). Standard library only: it runs in every image.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request

TIMEOUT_S = 4.0


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _request(role: str) -> urllib.request.Request:
    if role == "worker":
        port = os.environ.get("OMNILIVE_WORKER_BASE_PORT", "22400")
        token = os.environ.get("OMNILIVE_INTERNAL_TOKEN", "")
        headers = {"Authorization": f"Bearer {token}"}
        return urllib.request.Request(f"http://127.0.0.1:{port}/health", headers=headers)
    port = os.environ.get("OMNILIVE_PORT", "8006")
    https = bool(os.environ.get("OMNILIVE_SSL_CERTFILE")) or _flag("OMNILIVE_SSL_SELF_SIGNED")
    return urllib.request.Request(f"{'https' if https else 'http'}://127.0.0.1:{port}/health")


def unhealthy(role: str) -> str | None:
    """Why the process is not healthy, or None."""
    # The gateway's own certificate, on loopback: its name and issuer are
    # not what this probe is about.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = _request(role)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
            body = json.load(response)
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        return f"{request.full_url}: {exc}"
    if role == "worker" and not body.get("model_loaded"):
        return f"engine {body.get('engine')}: {body.get('worker_status')} {body.get('error') or ''}"
    return None


def main(argv: list[str]) -> int:
    role = argv[1] if len(argv) > 1 else "gateway"
    if role not in {"gateway", "worker"}:
        print(f"usage: {argv[0]} [gateway|worker]", file=sys.stderr)
        return 2
    reason = unhealthy(role)
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
