"""The gateway's certificates on real files: a self-signed one made once with
its key 0600, reused, made again when it expires, stops naming the bind
address or its key is exposed; given files checked with one clear reason;
and the settings that choose between them."""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from pydantic import ValidationError

from omnilive.config import load_settings
from omnilive.tls import (
    CERT_NAME,
    KEY_NAME,
    TlsError,
    gateway_certificate,
    load_pair,
    names_for,
    self_signed,
)
from tests.tls_servers import bad_files, sha256_colons


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _sans(certfile: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*san.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def test_made_once_with_a_private_key_then_reused(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    # A permissive umask: the key's mode must come from its creation, not the umask.
    previous = os.umask(0)
    try:
        made = self_signed(folder, "127.0.0.1")
    finally:
        os.umask(previous)
    key, cert = folder / KEY_NAME, folder / CERT_NAME
    assert _mode(key) == 0o600
    assert _mode(folder) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == [CERT_NAME, KEY_NAME]  # no leftovers
    assert made.fingerprint == sha256_colons(ssl.PEM_cert_to_DER_cert(cert.read_text()))
    assert {"localhost", "127.0.0.1", "::1"} <= _sans(cert)
    assert made.self_signed and made.uvicorn_kwargs() == {
        "ssl_certfile": str(cert),
        "ssl_keyfile": str(key),
    }

    key_bytes, inode = key.read_bytes(), key.stat().st_ino
    again = self_signed(folder, "127.0.0.1")
    assert again.fingerprint == made.fingerprint
    assert key.read_bytes() == key_bytes and key.stat().st_ino == inode


def test_made_again_for_an_address_it_does_not_name(tmp_path: Path) -> None:
    first = self_signed(tmp_path, "127.0.0.1")
    assert self_signed(tmp_path, "localhost").fingerprint == first.fingerprint  # named already
    second = self_signed(tmp_path, "127.0.0.2")
    assert second.fingerprint != first.fingerprint
    assert {"127.0.0.2", "127.0.0.1", "localhost", "::1"} <= _sans(tmp_path / CERT_NAME)
    # The earlier names stay, so going back makes nothing new.
    assert self_signed(tmp_path, "127.0.0.1").fingerprint == second.fingerprint
    assert _mode(tmp_path / KEY_NAME) == 0o600


def test_made_again_once_expired(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    old = self_signed(tmp_path, "127.0.0.1", now=now - dt.timedelta(days=400))
    assert old.not_after < now
    fresh = self_signed(tmp_path, "127.0.0.1")
    assert fresh.fingerprint != old.fingerprint
    assert fresh.not_after > now + dt.timedelta(days=300)
    # Renewed a little before it expires, not on the day.
    near = self_signed(tmp_path, "127.0.0.1", now=fresh.not_after - dt.timedelta(days=1))
    assert near.fingerprint != fresh.fingerprint


def test_made_again_when_the_key_is_exposed_or_the_files_are_broken(tmp_path: Path) -> None:
    first = self_signed(tmp_path, "127.0.0.1")
    (tmp_path / KEY_NAME).chmod(0o644)
    second = self_signed(tmp_path, "127.0.0.1")
    assert second.fingerprint != first.fingerprint
    assert _mode(tmp_path / KEY_NAME) == 0o600
    (tmp_path / CERT_NAME).write_text("not a certificate\n")
    third = self_signed(tmp_path, "127.0.0.1")
    assert third.fingerprint not in (first.fingerprint, second.fingerprint)


def test_a_wildcard_bind_names_this_machine() -> None:
    names = names_for("0.0.0.0")
    assert {"localhost", "127.0.0.1", "::1", socket.gethostname().lower()} <= names
    assert "0.0.0.0" not in names and "::" not in names
    assert names_for("LocalHost") == {"localhost", "127.0.0.1", "::1"}


def test_given_files_are_checked(tmp_path: Path) -> None:
    files = bad_files(tmp_path)
    certfile, keyfile, other_key, junk = files.certfile, files.keyfile, files.other_key, files.junk
    loaded = load_pair(certfile, keyfile)
    assert loaded.names == {"127.0.0.1"} and not loaded.self_signed
    assert loaded.uvicorn_kwargs() == {"ssl_certfile": str(certfile), "ssl_keyfile": str(keyfile)}
    combined = tmp_path / "combined.pem"
    combined.write_bytes(keyfile.read_bytes() + certfile.read_bytes())
    assert load_pair(combined, None).uvicorn_kwargs() == {"ssl_certfile": str(combined)}

    problems = {
        (tmp_path / "absent.pem", keyfile): "cannot read the certificate",
        (junk, keyfile): "is not a PEM certificate",
        (certfile, tmp_path / "absent.key"): "cannot read the private key",
        (certfile, junk): "is not a PEM private key",
        (certfile, other_key): "is not the private key of the certificate",
        (certfile, None): "holds no private key",
    }
    for (cert, key), reason in problems.items():
        with pytest.raises(TlsError, match=reason) as caught:
            load_pair(cert, key)
        assert "\n" not in str(caught.value)


def test_settings_choose_one_source_of_certificate(tmp_path: Path) -> None:
    assert gateway_certificate(load_settings(None, {}, {"data_dir": tmp_path})) is None
    settings = load_settings(None, {"OMNILIVE_SSL_SELF_SIGNED": "true"}, {"data_dir": tmp_path})
    made = gateway_certificate(settings)
    assert made is not None and made.certfile == tmp_path / "tls" / CERT_NAME

    config = tmp_path / "omnilive.toml"
    config.write_text(f'ssl_certfile = "{made.certfile}"\nssl_keyfile = "{made.keyfile}"\n')
    given = gateway_certificate(load_settings(config, {}, {}))
    assert given is not None and given.fingerprint == made.fingerprint and not given.self_signed

    with pytest.raises(ValidationError, match="cannot be combined with ssl_certfile"):
        load_settings(config, {}, {"ssl_self_signed": True})
    with pytest.raises(ValidationError, match="needs ssl_certfile"):
        load_settings(None, {"OMNILIVE_SSL_KEYFILE": str(made.keyfile)}, {})
