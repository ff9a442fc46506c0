"""Real ``omnilive`` processes serving HTTPS and WSS, with a test CA (trustme).

Test clients trust a server's certificate through ``SSL_CERT_FILE``, which
both httpx and Python's default SSL context (what ``websockets`` uses for
``wss://``) read: the helpers of ``tests.servers`` and ``tests.clients`` then
work unchanged against an HTTPS server.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.servers import Server

FINGERPRINT = re.compile(r"SHA-256 fingerprint ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})")


class TlsServer(Server):
    """``omnilive serve`` whose public port speaks TLS (its certificate must name 127.0.0.1)."""

    @property
    def http(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"wss://127.0.0.1:{self.port}"


def issue(ca: trustme.CA, folder: Path, *names: str) -> tuple[Path, Path]:
    """A certificate for ``names`` signed by ``ca`` and its key, as PEM files."""
    leaf = ca.issue_cert(*names)
    certfile, keyfile = folder / "server.pem", folder / "server.key"
    leaf.cert_chain_pems[0].write_to_path(str(certfile))
    leaf.private_key_pem.write_to_path(str(keyfile))
    return certfile, keyfile


@dataclass(frozen=True)
class BadFiles:
    """A good certificate and key, and what goes wrong with such files."""

    certfile: Path
    keyfile: Path
    other_key: Path  # the key of another certificate
    junk: Path  # looks like PEM, is not


def bad_files(folder: Path) -> BadFiles:
    ca = trustme.CA()
    certfile, keyfile = issue(ca, folder, "127.0.0.1")
    other = folder / "other"
    other.mkdir()
    _, other_key = issue(ca, other, "127.0.0.1")
    junk = folder / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    return BadFiles(certfile, keyfile, other_key, junk)


def trust(monkeypatch: pytest.MonkeyPatch, cafile: Path) -> None:
    """Make this process's clients (httpx, websockets) trust ``cafile``."""
    monkeypatch.setenv("SSL_CERT_FILE", str(cafile))


def served_certificate(port: int, context: ssl.SSLContext, name: str = "127.0.0.1") -> bytes:
    """The DER certificate a server presents on ``port`` (after ``context`` verified it)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def sha256_colons(der: bytes) -> str:
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


def spki_hash(certfile: Path) -> str:
    """base64 SHA-256 of a certificate's public key, as Chromium's
    ``--ignore-certificate-errors-spki-list`` takes it."""
    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


async def logged_fingerprint(server: Server, timeout: float = 30.0) -> str:
    """The certificate fingerprint the server printed at start-up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = FINGERPRINT.search(server.full_log())
        if found:
            return found.group(1)
        assert server.process and server.process.poll() is None, server.log()
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no fingerprint logged:\n{server.log()}")
