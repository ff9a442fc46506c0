"""Keys, client tokens, origins and the open (keyless) mode, in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from omnilive.config import ApiKey, AuthSettings, load_settings
from omnilive.gateway.app import create_app
from omnilive.gateway.auth import is_loopback_host, origin_allowed
from omnilive.gateway.credentials import (
    ClientTokens,
    CredentialError,
    KeyRing,
    KeysFileError,
    read_keys_file,
)
from tests.security.conftest import ADMIN_KEY, USER_KEY, bearer, keyed_settings

# TestClient's WebSocket requests go to "testserver" unless told otherwise.
LOCAL = {"Host": "127.0.0.1:8006"}


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_tokens_expire_and_die_with_their_key():
    clock = Clock()
    keys = KeyRing([ApiKey(key=USER_KEY, name="alice")], clock)
    tokens = ClientTokens(keys, b"secret", clock)
    alice = keys.check_key(USER_KEY)
    token, expires_at = tokens.mint(alice, ttl_s=600)
    assert expires_at == 1_600 and token.startswith("olt.")
    assert tokens.check(token) == alice.__class__(**{**alice.__dict__, "via_token": True})
    clock.now = 1_599.0
    assert tokens.check(token).name == "alice"
    clock.now = 1_600.0
    with pytest.raises(CredentialError, match="expired"):
        tokens.check(token)
    # another server's secret, a tampered expiry, a key that is gone
    clock.now = 1_000.0
    with pytest.raises(CredentialError, match="invalid"):
        ClientTokens(keys, b"other", clock).check(token)
    prefix, key_id, _, nonce, mac = token.split(".")
    with pytest.raises(CredentialError, match="invalid"):
        tokens.check(f"{prefix}.{key_id}.9999999999.{nonce}.{mac}")
    with pytest.raises(CredentialError, match="unknown"):
        ClientTokens(KeyRing([ApiKey(key=ADMIN_KEY)], clock), b"secret", clock).check(token)
    for junk in ("", "olt.", "olt.a.b.c.d", "x" * 300, "olt.a.1.b.c.d"):
        with pytest.raises(CredentialError):
            tokens.check(junk)


def test_keys_expire_and_duplicates_are_refused():
    clock = Clock()
    keys = KeyRing([ApiKey(key=USER_KEY, expires_at=1_010.0)], clock)
    assert keys.check_key(USER_KEY).role == "user"
    clock.now = 1_010.0
    with pytest.raises(CredentialError, match="expired"):
        keys.check_key(USER_KEY)
    with pytest.raises(CredentialError, match="unknown"):
        keys.check_key("nope")
    with pytest.raises(ValueError, match="twice"):
        KeyRing([ApiKey(key=USER_KEY), ApiKey(key=USER_KEY, role="admin")])
    with pytest.raises(ValueError):
        ApiKey(key="short")


def test_keys_file(tmp_path: Path):
    path = tmp_path / "keys.txt"
    path.write_text(f"# who\n{USER_KEY} user Alice Smith\n\n{ADMIN_KEY}  admin  # ops\n")
    keys = read_keys_file(path)
    assert [(k.role, k.name) for k in keys] == [("user", "Alice Smith"), ("admin", "")]
    ring = KeyRing.from_settings(AuthSettings(keys_file=path))
    assert ring.check_key(ADMIN_KEY).is_admin and len(ring) == 2
    path.write_text(f"{USER_KEY} root\n")
    with pytest.raises(KeysFileError, match=":1:"):
        read_keys_file(path)
    with pytest.raises(KeysFileError, match="cannot read"):
        read_keys_file(tmp_path / "missing")


def test_origin_and_host_rules():
    assert origin_allowed("http://127.0.0.1:8006", "127.0.0.1:8006", [])
    assert origin_allowed("https://Chat.Example.com", "chat.example.com", [])
    assert not origin_allowed("http://evil.example", "127.0.0.1:8006", [])
    assert not origin_allowed("null", "127.0.0.1:8006", [])
    assert origin_allowed("http://app.example", "127.0.0.1:8006", ["http://app.example"])
    assert origin_allowed("http://anything", "x", ["*"])
    for host in ("127.0.0.1:8006", "localhost", "[::1]:80", "a.localhost:1", "127.1.2.3"):
        assert is_loopback_host(host), host
    for host in ("example.com", "10.0.0.1:8006", "127.0.0.1.evil.com", "", "[::2]"):
        assert not is_loopback_host(host), host


def test_client_secrets_endpoint(tmp_path: Path):
    app = create_app(keyed_settings(tmp_path, OMNILIVE_AUTH__MAX_TOKEN_TTL_S="900"))
    with TestClient(app, base_url="http://127.0.0.1:8006") as client:
        minted = client.post("/v1/client_secrets", headers=bearer(USER_KEY))
        assert minted.status_code == 200
        body = minted.json()
        assert set(body) == {"token", "expires_at", "ttl_s"} and body["ttl_s"] == 600
        longer = client.post("/v1/client_secrets", headers=bearer(USER_KEY), json={"ttl_s": 10**6})
        assert longer.json()["ttl_s"] == 900  # capped
        bad = client.post("/v1/client_secrets", headers=bearer(USER_KEY), json={"ttl": 5})
        assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"
        # a token opens a session three ways, and cannot mint another token
        token = body["token"]
        again = client.post("/v1/client_secrets", headers=bearer(token))
        assert again.status_code == 401
        for kwargs in (
            {"headers": bearer(token)},
            {"subprotocols": ["omnilive", f"omnilive.token.{token}"]},
        ):
            with client.websocket_connect("/ws/chat", **kwargs) as ws:
                ws.send_text("{}")
                assert json.loads(ws.receive_text())["code"] == "invalid_request"
        with client.websocket_connect(f"/ws/chat?token={token}") as ws:
            ws.send_text("{}")
            assert json.loads(ws.receive_text())["code"] == "invalid_request"
        with client.websocket_connect(
            "/ws/chat", subprotocols=["omnilive", f"omnilive.token.{token}"]
        ) as ws:
            assert ws.accepted_subprotocol == "omnilive"


def test_websocket_origins_with_keys(tmp_path: Path):
    settings = keyed_settings(tmp_path, OMNILIVE_AUTH__ALLOWED_ORIGINS="https://app.example")
    app = create_app(settings)
    with TestClient(app, base_url="http://127.0.0.1:8006") as client:
        key = {**bearer(USER_KEY), **LOCAL}
        for origin, allowed in (
            ("http://127.0.0.1:8006", True),  # same origin
            ("https://app.example", True),  # listed
            ("https://evil.example", False),
        ):
            headers = {**key, "Origin": origin}
            if allowed:
                with client.websocket_connect("/ws/chat", headers=headers):
                    pass
            else:
                with (
                    pytest.raises(WebSocketDenialResponse) as denied,
                    client.websocket_connect("/ws/chat", headers=headers),
                ):
                    pass
                assert denied.value.status_code == 403
                assert denied.value.json()["code"] == "origin_not_allowed"
        # state-changing HTTP from a foreign page is refused too; reads are not
        evil = {**key, "Origin": "https://evil.example"}
        assert client.post("/api/chat", headers=evil, content=b"{}").status_code == 403
        assert client.get("/api/apps", headers=evil).status_code == 200


def test_open_gateway_answers_only_as_loopback_and_only_same_origin(tmp_path: Path):
    settings = load_settings(
        environ={"OMNILIVE_INTERNAL_TOKEN": "t", "OMNILIVE_DATA_DIR": str(tmp_path / "data")}
    )
    app = create_app(settings)
    with TestClient(app, base_url="http://127.0.0.1:8006") as client:
        assert client.get("/api/admin/apps").status_code == 200  # no key needed
        with client.websocket_connect("/ws/chat", headers=LOCAL):
            pass
        evil = {**LOCAL, "Origin": "http://evil.example"}
        with (
            pytest.raises(WebSocketDenialResponse) as denied,
            client.websocket_connect("/ws/chat", headers=evil),
        ):
            pass
        assert denied.value.status_code == 403
        # DNS rebinding: a foreign name that resolves to 127.0.0.1
        rebound = client.get("/api/admin/apps", headers={"Host": "evil.example:8006"})
        assert rebound.status_code == 403
        assert client.get("/health", headers={"Host": "evil.example"}).status_code == 200
    insecure = settings.model_copy(
        update={"auth": settings.auth.model_copy(update={"insecure": True})}
    )
    with TestClient(create_app(insecure), base_url="http://10.1.2.3:8006") as client:
        assert client.get("/api/apps").status_code == 200
