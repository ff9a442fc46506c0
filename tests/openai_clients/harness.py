"""What the conformance tests with OpenAI's own clients share: the Node
clients (``node/clients.mjs``, installed by ``make test`` with ``npm ci``),
the check of every server event against the ``openai`` package's
TypeScript types (generated from OpenAI's OpenAPI spec: a field the spec
gives no null must not be null, a field it does not know must not be
there), and speech in the GA dialect's audio format."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agents.realtime import (
    RealtimeAgent,
    RealtimeModelConfig,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionModelSettings,
)

from omnilive.audio import INPUT_RATE, resample
from tests.servers import Server
from tests.speech import silence, speak
from tests.tls_servers import TlsServer

NODE_DIR = Path(__file__).parent / "node"
NODE = NODE_DIR / "node_modules" / ".bin" / "node"
TSC = NODE_DIR / "node_modules" / ".bin" / "tsc"
MODEL = "omnilive-realtime"
REALTIME_TYPES = NODE_DIR / "node_modules" / "openai" / "resources" / "realtime" / "realtime.js"

# Where omnilive follows OpenAI's server and clients over the generated types,
# on purpose: the session objects carry id, object and expires_at (OpenAI's
# own server sends them; the type lacks them), and a user's speech item says
# transcript null until it is transcribed (the JS Agents SDK's item schema
# requires the field; the type says optional, not null).
_SESSION_EXTRAS = ("id", "object", "expires_at")


def pcm24(audio: np.ndarray) -> bytes:
    """16 kHz float32 as the GA dialect's audio/pcm: 24 kHz 16-bit little-endian."""
    samples = resample(audio, INPUT_RATE, 24_000)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def question(text: str = "What is the weather like today?") -> np.ndarray:
    """A spoken question with the silence around it that ends a server-VAD turn."""
    return np.concatenate([silence(0.5), speak(text), silence(1.5)])


@contextlib.contextmanager
def tls_serving(folder: Path, ready_timeout: float = 60, **options: Any) -> Iterator[Server]:
    """``omnilive serve --ssl-self-signed`` (the docs' recipe for the Node
    clients, which speak only ``wss://``) until the block ends; this
    process's clients trust its certificate meanwhile."""
    server = TlsServer(folder, args=["--ssl-self-signed"], **options).start()
    before = os.environ.get("SSL_CERT_FILE")
    try:
        server.ports()  # bound, so its certificate is made
        os.environ["SSL_CERT_FILE"] = str(certificate(server))
        asyncio.run(server.wait_ready(timeout=ready_timeout, workers=1))
        yield server
    finally:
        server.stop()
        if before is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = before


def certificate(server: Server) -> Path:
    return server.tmp / "data" / "tls" / "cert.pem"


def require_node() -> None:
    if not NODE.exists() or not TSC.exists():
        pytest.fail(f"OpenAI's JS clients are not installed: `make test` runs npm ci in {NODE_DIR}")


def run_node(
    client: str,
    scenario: str,
    base_url: str,
    folder: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 30,
) -> dict[str, Any]:
    """One scenario of ``node/clients.mjs``; its report (events, refusals, errors, results)."""
    require_node()
    out = folder / f"{client}-{scenario}.json"
    environ = {**os.environ, "OMNILIVE_BASE_URL": base_url, **(env or {})}
    environ["SCENARIO_TIMEOUT_MS"] = str(int(timeout_s * 1000))
    done = subprocess.run(
        [str(NODE), str(NODE_DIR / "clients.mjs"), client, scenario, str(out)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout_s + 30,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], report.get("errors"))
    return report


def _as_typed(value: Any, in_session: bool = False) -> Any:
    """An event as the generated types describe it, but for the deliberate
    differences above."""
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if in_session and key in _SESSION_EXTRAS:
                continue
            if key == "transcript" and item is None and value.get("type") == "input_audio":
                continue
            kept[key] = _as_typed(item, in_session=key == "session")
        return kept
    if isinstance(value, list):
        return [_as_typed(item) for item in value]
    return value


def type_errors(events: list[dict[str, Any]], folder: Path) -> list[str]:
    """What TypeScript, strict, says of ``events`` as ``RealtimeServerEvent[]``
    (the openai package's own union): [] when every event fits its type."""
    require_node()
    source = folder / "server_events.ts"
    typed = json.dumps([_as_typed(event) for event in events], indent=1)
    source.write_text(
        f"import type {{ RealtimeServerEvent }} from {json.dumps(str(REALTIME_TYPES))};\n"
        f"export const events: RealtimeServerEvent[] = {typed};\n"
    )
    check = subprocess.run(
        [str(NODE), str(TSC), "--noEmit", "--strict", "--skipLibCheck", "--module", "nodenext",
         "--moduleResolution", "nodenext", "--typeRoots", str(NODE_DIR / "node_modules/@types"),
         str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    return [line for line in check.stdout.splitlines() if "error TS" in line]


def node_scenario(
    server: Server,
    client: str,
    name: str,
    folder: Path,
    speech: Path | None = None,
    timeout_s: float = 30,
) -> Any:
    """A scenario's results, once it ran as it should: no error the client
    reported or was sent, no event its schema or OpenAI's types refuse."""
    env = {"NODE_EXTRA_CA_CERTS": str(certificate(server))}
    if speech is not None:
        env["SPEECH_PCM"] = str(speech)
    report = run_node(client, name, f"{server.http}/v1", folder, env, timeout_s)
    assert report["errors"] == [], report["errors"]
    assert report["refused"] == [], report["refused"]  # what the agents SDK would drop
    assert "error" not in [e["type"] for e in report["events"]]
    assert type_errors(report["events"], folder) == []
    return report["results"]


# --- the Python Agents SDK -----------------------------------------------------------------


class Recorded:
    """A session's events as the app sees them, and the server's as the SDK got them."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.kinds: list[str] = []
        self.errors: list[Any] = []
        self.server_events: list[dict[str, Any]] = []

    async def until(self, kind: str, timeout: float = 30) -> Any:
        """The session's next event of ``kind``; errors are kept, never skipped."""
        async with asyncio.timeout(timeout):
            async for event in self.session:
                self.kinds.append(event.type)
                if event.type == "error":
                    self.errors.append(event.error)
                elif event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    self.server_events.append(event.data.data)
                if event.type == kind:
                    return event
        raise AssertionError(f"the session ended before {kind}: {self.kinds}")

    async def until_server(self, kind: str, count: int, timeout: float = 30) -> None:
        """Until the server has sent ``count`` events of ``kind``."""
        async with asyncio.timeout(timeout):
            while sum(e["type"] == kind for e in self.server_events) < count:
                await self.until("raw_model_event")


@contextlib.asynccontextmanager
async def session_of(
    server: Server, agent: RealtimeAgent, settings: RealtimeSessionModelSettings | None = None
) -> AsyncIterator[Recorded]:
    """``agent`` run by ``RealtimeRunner`` against ``server``, as an app does."""
    url = f"{server.ws}/v1/realtime?model={MODEL}"
    config: RealtimeModelConfig = {"url": url, "api_key": "an-open-gateway-takes-any-key"}
    if settings:
        config["initial_model_settings"] = settings
    session = await RealtimeRunner(agent).run(model_config=config)
    async with session:
        yield Recorded(session)


def conforming(recorded: Recorded, folder: Path) -> None:
    """The SDK validated every event without an error, none was an error,
    and every one fits OpenAI's TypeScript types."""
    assert recorded.errors == [], recorded.errors
    assert "error" not in [e["type"] for e in recorded.server_events]
    assert type_errors(recorded.server_events, folder) == []
