"""HTTPS and WSS through real processes: a gateway with a test CA's
certificate serves chat and duplex sessions over ``wss://``, speaks nothing
but TLS on its port, and still talks plain HTTP to its workers on loopback;
``--ssl-self-signed`` makes its files once and reuses them; bad files, and
TLS without keys off loopback, stop the start in one line."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trustme
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage

from omnilive.serving import ExitCode
from tests.clients import open_client
from tests.integration.test_startup import last_line, omnilive, serve_args
from tests.servers import chat_once, user
from tests.speech import silence
from tests.tls_servers import (
    TlsServer,
    bad_files,
    issue,
    logged_fingerprint,
    served_certificate,
    sha256_colons,
    trust,
)

SECOND = silence(1.0) + 0.01  # quiet but not digital silence


@pytest.fixture
def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> trustme.CA:
    """A test CA that this process's clients trust."""
    authority = trustme.CA()
    cafile = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(cafile))
    trust(monkeypatch, cafile)
    return authority


@pytest.fixture
async def tls_server(tmp_path: Path, ca: trustme.CA) -> AsyncIterator[TlsServer]:
    certfile, keyfile = issue(ca, tmp_path, "127.0.0.1", "localhost")
    args = ["--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]
    server = TlsServer(tmp_path, args=args).start()
    try:
        await server.wait_ready(workers=1)
        yield server
    finally:
        server.stop()


async def test_chat_and_duplex_sessions_over_wss(tls_server: TlsServer) -> None:
    messages = await chat_once(tls_server, user("Hello over TLS"))
    assert messages[-1]["type"] == "done", messages
    assert "Hello over TLS" in messages[-1]["text"]

    client = await open_client(tls_server, path="/ws/duplex", query="?mode=audio")
    prepared = await client.prepare("#schedule:LS")
    assert prepared["mode"] == "audio_duplex"
    results = []
    for _ in range(2):
        await client.chunk(SECOND)
        results.append(await client.until("result", "error"))
    assert [r["type"] for r in results] == ["result", "result"], results
    assert [r["is_listen"] for r in results] == [True, False]
    assert results[1]["audio_data"]  # speech came back through the TLS socket
    await client.send({"type": "stop"})
    await client.until("stopped")


async def test_the_public_port_speaks_only_tls(
    tls_server: TlsServer, ca: trustme.CA, tmp_path: Path
) -> None:
    # The certificate presented is the one given on the command line.
    trusting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and trusts nothing yet
    ca.configure_trust(trusting)
    served = served_certificate(tls_server.port, trusting)
    given = ssl.PEM_cert_to_DER_cert((tmp_path / "server.pem").read_text())
    assert served == given

    # A client that does not trust the test CA is refused by its own check.
    stranger = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    trustme.CA().configure_trust(stranger)
    async with httpx.AsyncClient(verify=stranger) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get(f"{tls_server.http}/health")

    # Plain HTTP and ws:// get no answer on the TLS port.
    plain = f"http://127.0.0.1:{tls_server.port}"
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.TransportError):
            await client.get(f"{plain}/health", timeout=5)
    with pytest.raises(InvalidMessage, match="did not receive a valid HTTP response"):
        async with connect(f"ws://127.0.0.1:{tls_server.port}/ws/chat", open_timeout=5) as ws:
            await ws.send(json.dumps(user("never")))

    # The gateway's links to its workers stay plain HTTP on loopback.
    workers = (await tls_server.get("/workers"))["workers"]
    assert [w["url"].split(":")[:2] for w in workers] == [["http", "//127.0.0.1"]]
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{workers[0]['url']}/health", timeout=5)
    assert response.http_version == "HTTP/1.1"


async def test_self_signed_files_are_made_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "data" / "tls"
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    fingerprints = []
    for start in range(2):
        server = TlsServer(tmp_path, args=["--ssl-self-signed"]).start()
        try:
            fingerprint = await logged_fingerprint(server)
            trust(monkeypatch, certfile)  # a browser whose user accepted it
            await server.wait_ready(workers=1)
            fingerprints.append(fingerprint)
            # What the user checks is what the server presents.
            context = ssl.create_default_context(cafile=str(certfile))
            assert sha256_colons(served_certificate(server.port, context)) == fingerprint
            log = server.full_log()
            assert "WARNING" in log and "browsers will warn" in log, server.log()
            made = "making a self-signed certificate" in log
            assert made == (start == 0), server.log()
            messages = await chat_once(server, user("Hello, self-signed"))
            assert messages[-1]["type"] == "done", messages
        finally:
            server.stop()
        if start == 0:
            key_bytes = keyfile.read_bytes()
        assert keyfile.stat().st_mode & 0o777 == 0o600
        assert keyfile.read_bytes() == key_bytes
    assert fingerprints[0] == fingerprints[1]
    assert sorted(p.name for p in folder.iterdir()) == ["cert.pem", "key.pem"]


def test_bad_files_stop_the_start_in_one_line(tmp_path: Path) -> None:
    files = bad_files(tmp_path)
    certfile, keyfile, other_key, junk = files.certfile, files.keyfile, files.other_key, files.junk
    cases = {
        ("--ssl-certfile", str(tmp_path / "absent.pem"), "--ssl-keyfile", str(keyfile)): (
            f"cannot read the certificate {tmp_path / 'absent.pem'}: No such file or directory"
        ),
        ("--ssl-certfile", str(junk), "--ssl-keyfile", str(keyfile)): (
            f"{junk} is not a PEM certificate"
        ),
        ("--ssl-certfile", str(certfile), "--ssl-keyfile", str(other_key)): (
            f"{other_key} is not the private key of the certificate {certfile}"
        ),
        ("--ssl-certfile", str(certfile), "--ssl-keyfile", str(junk)): (
            f"{junk} is not a PEM private key"
        ),
        ("--ssl-self-signed", "--ssl-certfile", str(certfile)): (
            "bad settings: ssl_self_signed: cannot be combined with ssl_certfile"
        ),
        ("--ssl-keyfile", str(keyfile)): "bad settings: ssl_keyfile: needs ssl_certfile",
    }
    for args, reason in cases.items():
        run = omnilive(tmp_path, *serve_args(tmp_path, "--engine", "scripted", *args))
        assert run.returncode == ExitCode.USAGE, run.stderr
        assert run.stderr.strip().startswith(f"omnilive serve: {reason}"), run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr

    # The same through the settings file, for the gateway alone.
    config = tmp_path / "omnilive.toml"
    config.write_text(f'ssl_certfile = "{certfile}"\nssl_keyfile = "{other_key}"\n')
    gateway = omnilive(
        tmp_path,
        *("gateway", "--config", str(config), "--worker", "http://127.0.0.1:1"),
        env={"OMNILIVE_INTERNAL_TOKEN": "t" * 32},
    )
    assert gateway.returncode == ExitCode.USAGE, gateway.stderr
    assert last_line(gateway) == (
        f"omnilive gateway: {other_key} is not the private key of the certificate {certfile}"
    )
    assert len(gateway.stderr.strip().splitlines()) == 1, gateway.stderr


def test_tls_does_not_replace_api_keys_off_loopback(tmp_path: Path) -> None:
    run = omnilive(
        tmp_path,
        *serve_args(tmp_path, "--engine", "scripted", "--host", "0.0.0.0", "--ssl-self-signed"),
    )
    assert run.returncode == ExitCode.USAGE, run.stderr
    assert last_line(run).startswith(
        "omnilive serve: no API keys are configured, so the gateway binds loopback only"
    )
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "data" / "tls").exists()  # refused before anything was made
