"""The signalling routes in process (no workers, no peer): the pages' ICE
configuration, and a switched-off transport refusing clearly."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from omnilive.config import load_settings
from omnilive.gateway.app import create_app

TURN = {"urls": ["turn:turn.example.org:3478"], "username": "u", "credential": "p"}


def client_for(tmp: Path, **env: str) -> TestClient:
    settings = load_settings(
        environ={"OMNILIVE_INTERNAL_TOKEN": "internal", "OMNILIVE_DATA_DIR": str(tmp), **env}
    )
    return TestClient(create_app(settings), base_url="http://127.0.0.1:8006")


def test_the_pages_get_the_ice_servers(tmp_path: Path):
    servers = json.dumps([{"urls": ["stun:stun.example.org:3478"]}, TURN])
    with client_for(tmp_path, OMNILIVE_WEBRTC__ICE_SERVERS=servers) as client:
        config = client.get("/api/webrtc/config").json()
    assert config["enabled"] and config["open"] == 0 and config["limit"] == 32
    assert config["ice_servers"] == [{"urls": ["stun:stun.example.org:3478"]}, TURN]


def test_switched_off(tmp_path: Path):
    with client_for(tmp_path, OMNILIVE_WEBRTC__ENABLED="false") as client:
        assert client.get("/api/webrtc/config").json()["enabled"] is False
        ga = client.post(
            "/v1/realtime/calls", content=b"v=0", headers={"Content-Type": "application/sdp"}
        )
        own = client.post("/api/webrtc/half_duplex/hd_x", content=b"v=0")
    assert ga.status_code == 503 and ga.json()["error"]["code"] == "webrtc_disabled"
    assert own.status_code == 503 and own.json()["code"] == "webrtc_disabled"


def test_a_duplex_call_refuses_slices_out_of_range(tmp_path: Path):
    with client_for(tmp_path) as client:
        for bad in ("0", "10", "two"):
            response = client.post(f"/api/webrtc/duplex/dx_x?max_slice_nums={bad}", content=b"v=0")
            assert response.status_code == 422, response.text
            assert "max_slice_nums" in response.text
