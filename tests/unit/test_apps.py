"""App switches: the registry saved under the data dir, its API, and every
mode's refusal when its app is disabled (close 1008, HTTP 403)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnilive.apps import APP_IDS, AppSwitches, app_of
from omnilive.config import Settings, load_settings
from omnilive.gateway.routes import admin, apps, chat, duplex, half_duplex, realtime
from tests.gateway_app import gateway_app


def test_switches_default_to_enabled_and_persist(tmp_path: Path):
    switches = AppSwitches(tmp_path).load()
    assert all(switches.is_enabled(app_id) for app_id in APP_IDS)
    app = switches.set("omni", False)
    assert app.id == "omni" and app.enabled is False and app.path == "/omni"
    saved = json.loads((tmp_path / "state" / "apps.json").read_text())
    assert saved["enabled"]["omni"] is False
    again = AppSwitches(tmp_path).load()
    assert not again.is_enabled("omni") and again.is_enabled("realtime")
    assert [a.id for a in again.apps(only_enabled=True)] == [
        "turnbased", "half_duplex", "audio_duplex", "realtime",
    ]  # fmt: skip
    with pytest.raises(KeyError):
        again.set("nonsense", True)


@pytest.mark.parametrize(
    "content", [b"{not json", b"[]", b'{"enabled": {"omni": "no", "gone": false}}']
)
def test_a_broken_or_foreign_state_file_leaves_everything_enabled(tmp_path: Path, content):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "apps.json").write_bytes(content)
    switches = AppSwitches(tmp_path).load()
    assert all(switches.is_enabled(app_id) for app_id in APP_IDS)


def test_request_types_map_to_apps():
    assert [app_of(t) for t in ("chat", "half_duplex", "audio_duplex", "omni_duplex")] == [
        "turnbased", "half_duplex", "audio_duplex", "omni",
    ]  # fmt: skip


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(None, {}, {"data_dir": tmp_path / "data"})


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    routers = (apps.router, admin.router, chat.router, half_duplex.router, duplex.router)
    app = gateway_app(settings, *routers, realtime.router)
    with TestClient(app) as test_client:
        yield test_client


def test_api_lists_enabled_apps_and_admin_lists_all(client: TestClient, settings: Settings):
    listed = client.get("/api/apps").json()["apps"]
    assert [a["id"] for a in listed] == list(APP_IDS)
    assert set(listed[0]) == {
        *("id", "name", "name_zh", "description", "path", "enabled"),  # ours
        *("app_id", "route"),  # the reference's
    }
    reference = {a["app_id"]: a["route"] for a in listed}
    assert reference["half_duplex_audio"] == "/half_duplex"
    assert reference["omni"] == "/omni" and reference["audio_duplex"] == "/audio_duplex"
    response = client.put("/api/admin/apps/half_duplex", json={"enabled": False})
    assert response.status_code == 200
    assert response.json()["id"] == "half_duplex" and response.json()["enabled"] is False
    assert response.json()["success"] is True
    assert response.json()["app"]["app_id"] == "half_duplex_audio"
    assert "half_duplex" not in [a["id"] for a in client.get("/api/apps").json()["apps"]]
    everything = client.get("/api/admin/apps").json()["apps"]
    assert {a["id"]: a["enabled"] for a in everything}["half_duplex"] is False
    assert len(everything) == 5
    assert AppSwitches(settings.data_dir).load().is_enabled("half_duplex") is False
    # The reference's pages and scripts name it by their id.
    client.put("/api/admin/apps/half_duplex_audio", json={"enabled": True})
    assert len(client.get("/api/apps").json()["apps"]) == 5


def test_admin_put_refuses_unknown_apps_and_bad_bodies(client: TestClient):
    assert client.put("/api/admin/apps/nope", json={"enabled": False}).status_code == 404
    for body in ({}, {"enabled": "no"}, {"enabled": False, "extra": 1}, [1]):
        assert client.put("/api/admin/apps/omni", json=body).status_code == 422, body
    assert client.put("/api/admin/apps/omni", content=b"{").status_code == 422


def _refused(client: TestClient, path: str) -> tuple[dict, int]:
    with client.websocket_connect(path) as ws:
        error = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    return error, closed.value.code


@pytest.mark.parametrize(
    ("app_id", "path"),
    [
        ("turnbased", "/ws/chat"),
        ("half_duplex", "/ws/half_duplex/s1"),
        ("audio_duplex", "/ws/duplex/s1?mode=audio"),
        ("audio_duplex", "/ws/duplex/adx_s1"),
        ("omni", "/ws/duplex/s1?mode=omni"),
        ("omni", "/ws/duplex/s1"),
    ],
)
def test_a_disabled_mode_refuses_its_websocket_with_1008(client: TestClient, app_id, path):
    client.put(f"/api/admin/apps/{app_id}", json={"enabled": False})
    error, code = _refused(client, path)
    assert code == 1008
    assert error["type"] == "error" and error["code"] == "app_disabled" and app_id in error["error"]


def test_a_disabled_realtime_api_refuses_in_its_own_error_format(client: TestClient):
    client.put("/api/admin/apps/realtime", json={"enabled": False})
    error, code = _refused(client, "/v1/realtime?mode=audio")
    assert code == 1008
    assert error["type"] == "error"
    assert error["error"]["code"] == "app_disabled" and error["error"]["type"] == "client_error"


def _refused_after_created(client: TestClient, path: str) -> tuple[dict, int]:
    """An OpenAI GA connection's refusal, after its session.created if the
    session was made."""
    with client.websocket_connect(path) as ws:
        error = ws.receive_json()
        if error["type"] == "session.created":
            error = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    return error, closed.value.code


def test_the_openai_dialect_refuses_in_openais_error_shape(client: TestClient):
    # No worker: the server's refusal, close 1013 (try again later).
    error, code = _refused_after_created(client, "/v1/realtime?model=m")
    assert code == 1013 and error["type"] == "error"
    assert error["error"]["type"] == "server_error"
    assert error["error"]["code"] == "service_unavailable"
    # A disabled app: the client's request, close 1008.
    client.put("/api/admin/apps/realtime", json={"enabled": False})
    error, code = _refused_after_created(client, "/v1/realtime?model=m")
    assert code == 1008 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["code"] == "app_disabled"


def test_other_modes_stay_open_when_one_is_disabled(client: TestClient):
    client.put("/api/admin/apps/omni", json={"enabled": False})
    with client.websocket_connect("/ws/duplex/s1?mode=audio") as ws:
        # no worker in this app: the audio session is refused for that reason instead
        assert ws.receive_json()["code"] == "service_unavailable"


def test_a_disabled_chat_refuses_http_with_403(client: TestClient):
    client.put("/api/admin/apps/turnbased", json={"enabled": False})
    response = client.post("/api/chat", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 403
    assert response.json() == {
        "success": False,
        "error": response.json()["error"],
        "detail": response.json()["error"],  # the reference's (FastAPI's) name
        "code": "app_disabled",
    }
