"""OpenAI's JS Agents SDK in a real browser (Chromium), unmodified: a page
of an app's own origin loads the SDK's browser bundle and talks to omnilive
over the WebSocket with the client secret its backend minted at
``POST /v1/realtime/client_secrets``. In a browser the SDK takes only a key
that starts ``ek_``, as OpenAI's ephemeral keys do; omnilive's secret must
look so, and the app's origin be one the gateway allows."""

from __future__ import annotations

import functools
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from tests.browser.harness import chromium, run_async, watched_page
from tests.openai_clients.harness import NODE_DIR, require_node, type_errors
from tests.servers import Server

KEY = "browser-app-key-0123456789"


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def app_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app's own static server: the page and the SDK's bundle."""
    require_node()
    root = tmp_path_factory.mktemp("app")
    shutil.copy(Path(__file__).parent / "page" / "agents.html", root / "agents.html")
    bundle = NODE_DIR / "node_modules" / "@openai" / "agents-realtime" / "dist" / "bundle"
    shutil.copytree(bundle, root / "bundle")
    handler = functools.partial(Quiet, directory=str(root))
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=http.serve_forever, name="app-origin", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_address[1]}"
    http.shutdown()
    http.server_close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, app_origin: str) -> Iterator[Server]:
    env = {
        "OMNILIVE_AUTH__KEYS": json.dumps([{"key": KEY, "role": "user", "name": "app"}]),
        "OMNILIVE_AUTH__ALLOWED_ORIGINS": json.dumps([app_origin]),
    }
    server = Server(tmp_path_factory.mktemp("browser-agents"), env=env, api_key=KEY).start()
    try:
        run_async(server.wait_ready(workers=1))
        yield server
    finally:
        server.stop()


def client_secret(server: Server) -> str:
    """What the app's backend does: its API key in, a short-lived secret out."""
    answer = httpx.post(
        f"{server.http}/v1/realtime/client_secrets",
        json={"session": {"type": "realtime"}},
        headers=server.headers,
        timeout=10,
    )
    answer.raise_for_status()
    return answer.json()["value"]


def test_the_js_agents_sdk_in_a_browser(server: Server, app_origin: str, tmp_path: Path):
    secret = client_secret(server)
    assert secret.startswith("ek_")
    query = urlencode({"url": f"{server.ws}/v1/realtime?model=omnilive-realtime", "key": secret})
    with chromium(tmp_path) as context, watched_page(context) as (page, problems):
        page.goto(f"{app_origin}/agents.html?{query}")
        page.wait_for_function("window.result && window.result.finished", timeout=30_000)
        result = page.evaluate("window.result")
    assert result["errors"] == [] and problems.items == []
    assert result["answer"] == "Answered: hello from a browser"
    assert "error" not in [e["type"] for e in result["events"]]
    assert type_errors(result["events"], tmp_path) == []
    run_async(server.wait_idle(timeout=5))
