"""HTTPS and WSS on the gateway's public port.

Browsers give the microphone and the camera only to secure contexts, so a
page served off localhost must come over HTTPS. The certificate is either
given (uvicorn's ``ssl_certfile`` / ``ssl_keyfile``) or, for a LAN or a quick
demo, made here (``ssl_self_signed``): an EC key and a self-signed
certificate kept in ``data_dir/tls/`` and reused on later starts, made again
once they expire or no longer name the address the gateway binds. The key is
created with mode 0600 and never leaves that folder.

Everything that can be wrong with the files is a :class:`TlsError` whose
message is the one line the user sees.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import logging
import os
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from omnilive.config import Settings

log = logging.getLogger(__name__)

TLS_DIR = "tls"
CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"
KEY_MODE = 0o600
# Short enough for every browser's and OS's limits on self-signed server certificates.
VALIDITY = dt.timedelta(days=365)
# Made again this long before it expires, so a running server never outlives it by surprise.
RENEW_BEFORE = dt.timedelta(days=7)
# Tolerates a client clock slightly behind ours.
BACKDATE = dt.timedelta(minutes=5)
ALWAYS_NAMED = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
# Connecting a UDP socket sends nothing; it only asks the kernel which local
# address would route there (documentation addresses, never reached).
_ROUTE_PROBES = ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1"))


class TlsError(Exception):
    """A certificate or key that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Certificate:
    """The certificate the gateway serves, as checked at start-up."""

    certfile: Path
    keyfile: Path | None  # None: the certificate file holds the key as well
    fingerprint: str  # SHA-256 of the DER certificate, as browsers show it
    not_after: dt.datetime
    names: frozenset[str]  # its subject alternative names, normalized
    self_signed: bool = False

    def uvicorn_kwargs(self) -> dict[str, str]:
        """What ``uvicorn.Config`` takes to serve this certificate."""
        kwargs = {"ssl_certfile": str(self.certfile)}
        if self.keyfile is not None:
            kwargs["ssl_keyfile"] = str(self.keyfile)
        return kwargs


def fingerprint(der: bytes) -> str:
    """``AB:CD:...``: the SHA-256 fingerprint of a DER certificate."""
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


def _normal(name: str) -> str:
    """IP addresses in their canonical text, host names in lower case."""
    try:
        return str(ipaddress.ip_address(name.split("%", 1)[0]))
    except ValueError:
        return name.lower().rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _addresses(name: str) -> set[str]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {str(info[4][0]) for info in infos}


def _routed_addresses() -> set[str]:
    """This machine's addresses on its default routes (what a LAN reaches)."""
    found: set[str] = set()
    for family, probe in _ROUTE_PROBES:
        with socket.socket(family, socket.SOCK_DGRAM) as probe_socket:
            try:
                probe_socket.connect((probe, 9))
            except OSError:
                continue  # no route of this family
            found.add(str(probe_socket.getsockname()[0]))
    return found


def names_for(host: str) -> frozenset[str]:
    """The names a certificate for a gateway bound to ``host`` must carry:
    the host and what it resolves to (for a wildcard bind, this machine's
    host name and addresses), plus localhost, 127.0.0.1 and ::1."""
    names = set(ALWAYS_NAMED)
    if host in WILDCARD_HOSTS:
        hostname = socket.gethostname()
        names |= {hostname} | _addresses(hostname) | _routed_addresses()
    else:
        names.add(host)
        if not _is_ip(host):
            names |= _addresses(host)
    # DNS names in a certificate are ASCII (IDNA); an unspecified address names nothing.
    normal = {_normal(name) for name in names if name.isascii()}
    return frozenset(name for name in normal if name and name not in ("0.0.0.0", "::"))


def _san_names(cert: x509.Certificate) -> frozenset[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    dns = san.get_values_for_type(x509.DNSName)
    ips = san.get_values_for_type(x509.IPAddress)
    return frozenset(_normal(name) for name in [*dns, *(str(ip) for ip in ips)])


def load_pair(certfile: Path, keyfile: Path | None, self_signed: bool = False) -> Certificate:
    """The certificate in ``certfile``, checked to be a PEM certificate whose
    private key is in ``keyfile`` (or in ``certfile`` itself)."""
    try:
        data = certfile.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the certificate {certfile}: {exc.strerror}") from None
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError:
        raise TlsError(f"{certfile} is not a PEM certificate") from None
    if keyfile is not None:
        try:
            keyfile.read_bytes()
        except OSError as exc:
            raise TlsError(f"cannot read the private key {keyfile}: {exc.strerror}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # The password callback keeps OpenSSL from prompting on the terminal.
        context.load_cert_chain(certfile, keyfile, password=lambda: b"")
    except ssl.SSLError as exc:
        if keyfile is None:
            raise TlsError(f"{certfile} holds no private key: give it with ssl_keyfile") from None
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(
                f"{keyfile} is not the private key of the certificate {certfile}"
            ) from None
        raise TlsError(
            f"{keyfile} is not a PEM private key (one with a password is not supported)"
        ) from None
    return Certificate(
        certfile=certfile,
        keyfile=keyfile,
        fingerprint=fingerprint(cert.public_bytes(serialization.Encoding.DER)),
        not_after=cert.not_valid_after_utc,
        names=_san_names(cert),
        self_signed=self_signed,
    )


def _why_not_reusable(
    directory: Path, names: frozenset[str], now: dt.datetime
) -> tuple[str, Certificate | None]:
    """Why the files in ``directory`` must be made again (empty: they need
    not), and the certificate found there."""
    certfile, keyfile = directory / CERT_NAME, directory / KEY_NAME
    if not certfile.exists() or not keyfile.exists():
        return "none yet", None
    if keyfile.stat().st_mode & 0o777 != KEY_MODE:
        return f"{keyfile} is not mode {KEY_MODE:o}", None
    try:
        found = load_pair(certfile, keyfile, self_signed=True)
    except TlsError as exc:
        return str(exc), None
    if now >= found.not_after - RENEW_BEFORE:
        return f"it expires {found.not_after:%Y-%m-%d}", found
    missing = names - found.names
    if missing:
        return f"it does not name {', '.join(sorted(missing))}", found
    return "", found


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` whole or not at all: a new file, created with ``mode``
    (never widened afterwards), then renamed over the old one."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


def _general_name(name: str) -> x509.GeneralName:
    if _is_ip(name):
        return x509.IPAddress(ipaddress.ip_address(name))
    return x509.DNSName(name)


def _make(directory: Path, names: frozenset[str], now: dt.datetime) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "omnilive"),
            x509.NameAttribute(NameOID.COMMON_NAME, "omnilive self-signed"),
        ]
    )
    # Host names first: some clients show the first name.
    ordered = sorted(names, key=lambda name: (_is_ip(name), name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in ordered]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # The key first: a crash between the two leaves a pair that does not
    # match, which the next start makes again.
    _write_private(directory / KEY_NAME, key_pem, KEY_MODE)
    _write_private(directory / CERT_NAME, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def self_signed(directory: Path, host: str, now: dt.datetime | None = None) -> Certificate:
    """The self-signed certificate in ``directory`` for a gateway bound to
    ``host``: the one there if it is still good, else a new one."""
    now = now or dt.datetime.now(dt.UTC)
    names = names_for(host)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        reason, found = _why_not_reusable(directory, names, now)
        if not reason and found is not None:
            return found
        log.info("making a self-signed certificate in %s (%s)", directory, reason)
        # The names it carried stay, so that going back to an earlier bind
        # address does not make yet another certificate (and fingerprint).
        kept = found.names if found is not None else frozenset()
        _make(directory, names | kept, now)
    except OSError as exc:
        raise TlsError(f"cannot keep a certificate in {directory}: {exc.strerror}") from None
    return load_pair(directory / CERT_NAME, directory / KEY_NAME, self_signed=True)


def gateway_certificate(settings: Settings) -> Certificate | None:
    """The certificate the gateway's settings ask for, checked; None for plain HTTP."""
    if settings.ssl_self_signed:
        return self_signed(settings.data_dir / TLS_DIR, settings.host)
    if settings.ssl_certfile is not None:
        return load_pair(settings.ssl_certfile, settings.ssl_keyfile)
    return None


def announce(cert: Certificate, now: dt.datetime | None = None) -> None:
    """Tell the user what the browser will see: the fingerprint, and for a
    self-signed certificate, loudly, that the browser will warn."""
    now = now or dt.datetime.now(dt.UTC)
    log.info(
        "HTTPS and WSS with %s, valid until %s, for %s; SHA-256 fingerprint %s",
        cert.certfile,
        f"{cert.not_after:%Y-%m-%d}",
        ", ".join(sorted(cert.names)) or "no alternative names",
        cert.fingerprint,
    )
    if cert.self_signed:
        log.warning(
            "SELF-SIGNED certificate: browsers will warn that the connection is not private. "
            "Accept it only if the SHA-256 fingerprint they show is %s",
            cert.fingerprint,
        )
    elif cert.not_after <= now:
        log.warning("the certificate %s expired on %s", cert.certfile, f"{cert.not_after:%Y-%m-%d}")
