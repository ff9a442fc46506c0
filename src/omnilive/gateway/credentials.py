"""API keys and short-lived client tokens, without I/O beyond reading the keys file.

A key is looked up by the SHA-256 of what the client sent, so the secrets
themselves are kept only in the settings. A client token is stateless: an
HMAC over the fingerprint of the key that minted it and its expiry. Checking
a token also checks that its key still exists and has not expired, so
removing a key revokes its tokens at the next restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from omnilive.config import ApiKey, AuthSettings

TOKEN_PREFIX = "olt"
# A client token in the shape of OpenAI's ephemeral keys (POST
# /v1/realtime/client_secrets): OpenAI's JS SDKs take in a browser only a key
# that starts so. The same token behind it.
EPHEMERAL_PREFIX = "ek_"


class Role(StrEnum):
    USER = "user"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: one API key (directly or through a client token)."""

    key_id: str  # a fingerprint of the key, safe to log
    name: str
    role: Role
    via_token: bool = False
    max_sessions: int | None = None  # None: the server default
    requests_per_minute: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


# Everyone, when no key is configured (an open gateway on loopback).
ANONYMOUS = Principal(key_id="open", name="open", role=Role.ADMIN)


class CredentialError(Exception):
    """A credential that is missing, unknown, malformed or expired."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class KeysFileError(ValueError):
    """The keys file cannot be read or has a bad line."""


def fingerprint(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def read_keys_file(path: Path) -> list[ApiKey]:
    """``KEY ROLE [NAME]`` per line; blank lines and ``#`` comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeysFileError(f"cannot read keys file {path}: {exc}") from None
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) < 2 or fields[1] not in ("user", "admin"):
            raise KeysFileError(f"{path}:{number}: expected KEY ROLE [NAME], ROLE user or admin")
        try:
            keys.append(ApiKey(key=fields[0], role=fields[1], name=" ".join(fields[2:])))
        except ValueError as exc:
            raise KeysFileError(f"{path}:{number}: {exc}") from None
    return keys


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires_at: float | None


class KeyRing:
    """The configured API keys, by fingerprint."""

    def __init__(self, keys: Iterable[ApiKey], clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._by_digest: dict[bytes, _Entry] = {}
        self._by_id: dict[str, _Entry] = {}
        for key in keys:
            digest = hashlib.sha256(key.key.encode()).digest()
            if digest in self._by_digest:
                raise ValueError(f"API key {key.name or fingerprint(key.key)} is listed twice")
            key_id = fingerprint(key.key)
            principal = Principal(
                key_id=key_id,
                name=key.name or key_id,
                role=Role(key.role),
                max_sessions=key.max_sessions,
                requests_per_minute=key.requests_per_minute,
            )
            entry = _Entry(principal, key.expires_at)
            self._by_digest[digest] = entry
            self._by_id[key_id] = entry

    @classmethod
    def from_settings(
        cls, settings: AuthSettings, clock: Callable[[], float] = time.time
    ) -> KeyRing:
        keys = list(settings.keys)
        if settings.keys_file is not None:
            keys += read_keys_file(settings.keys_file)
        return cls(keys, clock)

    @property
    def open(self) -> bool:
        """No key is configured: nobody needs one."""
        return not self._by_digest

    def __len__(self) -> int:
        return len(self._by_digest)

    def _valid(self, entry: _Entry | None, what: str) -> Principal:
        if entry is None:
            raise CredentialError(f"unknown {what}")
        if entry.expires_at is not None and self.clock() >= entry.expires_at:
            raise CredentialError(f"{what} has expired")
        return entry.principal

    def check_key(self, secret: str) -> Principal:
        digest = hashlib.sha256(secret.encode()).digest()
        return self._valid(self._by_digest.get(digest), "API key")

    def by_id(self, key_id: str) -> Principal:
        return self._valid(self._by_id.get(key_id), "API key of this client token")


class ClientTokens:
    """Mints and checks ``olt.<key id>.<expiry>.<nonce>.<mac>`` tokens.

    The characters are those a WebSocket subprotocol name may hold, so
    browsers can send a token as ``Sec-WebSocket-Protocol``.
    """

    def __init__(
        self, keys: KeyRing, secret: bytes, clock: Callable[[], float] = time.time
    ) -> None:
        self.keys = keys
        self._secret = secret
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: AuthSettings, keys: KeyRing) -> ClientTokens:
        secret = settings.token_secret.encode() or secrets.token_bytes(32)
        return cls(keys, secret, keys.clock)

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._secret, body.encode(), hashlib.sha256).digest())

    def mint(self, principal: Principal, ttl_s: float) -> tuple[str, float]:
        """A token for ``principal`` and its expiry (Unix seconds)."""
        expires_at = int(self.clock() + ttl_s)
        body = f"{TOKEN_PREFIX}.{principal.key_id}.{expires_at}.{secrets.token_urlsafe(9)}"
        return f"{body}.{self._mac(body)}", float(expires_at)

    @staticmethod
    def looks_like_token(value: str) -> bool:
        return value.removeprefix(EPHEMERAL_PREFIX).startswith(TOKEN_PREFIX + ".")

    def check(self, token: str) -> Principal:
        token = token.removeprefix(EPHEMERAL_PREFIX)
        parts = token.split(".")
        if len(parts) != 5 or parts[0] != TOKEN_PREFIX or not parts[2].isdigit():
            raise CredentialError("malformed client token")
        body, mac = token.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac(body)):
            raise CredentialError("invalid client token")
        if self.clock() >= int(parts[2]):
            raise CredentialError("client token has expired")
        principal = self.keys.by_id(parts[1])
        return Principal(
            key_id=principal.key_id,
            name=principal.name,
            role=principal.role,
            via_token=True,
            max_sessions=principal.max_sessions,
            requests_per_minute=principal.requests_per_minute,
        )
