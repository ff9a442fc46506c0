"""The session API in process: each endpoint, traversal refused, the zip
streamed and complete, uploads typed and capped, comments capped."""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from omnilive.audio import tone
from omnilive.config import Settings, load_settings
from omnilive.engines.messages import AudioPart, ChatMessage, ImagePart, TextPart
from omnilive.gateway.http_errors import install_error_handlers
from omnilive.gateway.pool import Pool
from omnilive.gateway.routes import sessions
from omnilive.gateway.state import Gateway
from omnilive.recording import archive
from omnilive.recording.turns import TurnInput, TurnOutput, TurnRecorder
from tests.recordings import png

RID = "chat_apitestAbc123"
WEBM = b"\x1a\x45\xdf\xa3" + bytes(1020)
MP4 = b"\x00\x00\x00\x20ftypisom" + bytes(1012)
WAV = b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(1008)


async def _record(settings: Settings, recording_id: str) -> None:
    recorder = TurnRecorder.open(settings, "chat", recording_id, worker_id="w0", config={})
    assert recorder is not None
    user = ChatMessage(
        "user", (TextPart("hi"), AudioPart(tone(0.5, 16_000, 440)), ImagePart(png()))
    )
    output = TurnOutput()
    output.add("hello", tone(0.5, 24_000, 500), recorder.start_ts + 0.1)
    await recorder.turn(recorder.start_ts, TurnInput(messages=[user]), output, {"total_ms": 1.0})
    await recorder.close()
    assert await recorder.wait_closed(30)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    environ = {"OMNILIVE_RECORDING__MAX_UPLOAD_MB": "0.01"}  # 10 KiB
    settings = load_settings(None, environ, {"data_dir": tmp_path / "data"})
    asyncio.run(_record(settings, RID))
    asyncio.run(_record(settings, "chat_neighbour"))
    return settings


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(sessions.router)
    app.state.gateway = Gateway(settings=settings, pool=Pool(settings))
    with TestClient(app) as test_client:
        yield test_client


def session_dir(settings: Settings, recording_id: str = RID) -> Path:
    return settings.data_dir / "sessions" / recording_id


def test_meta_recording_and_assets(client: TestClient, settings: Settings):
    meta = client.get(f"/api/sessions/{RID}").json()
    assert meta["session_id"] == RID and meta["status"] == "ended"
    recording = client.get(f"/api/sessions/{RID}/recording")
    assert recording.headers["content-type"] == "application/json"
    turn = recording.json()["turns"][0]
    audio = client.get(f"/api/sessions/{RID}/assets/{turn['output']['audio']}")
    assert audio.status_code == 200 and audio.content[:4] == b"RIFF"
    image = turn["input"]["messages"][0]["content"][2]["file"]
    assert client.get(f"/api/sessions/{RID}/assets/{image}").content == png()
    replay = client.get(f"/api/sessions/{RID}/assets/merged_replay.wav")
    assert replay.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "..%2Fchat_neighbour%2Fmeta.json",
        "%2e%2e/chat_neighbour/meta.json",
        "user_audio/%2e%2e/%2e%2e/chat_neighbour/meta.json",
        "%2Fetc%2Fpasswd",
        "/etc/passwd",
        "..%5Cmeta.json",
        "user_audio",  # a directory
        "nothing.wav",
        ".meta.json.1234.tmp",
    ],
)
def test_asset_paths_out_of_the_session_are_refused(client: TestClient, path: str):
    response = client.get(f"/api/sessions/{RID}/assets/{path}")
    assert response.status_code == 404, path


def test_symlinks_out_of_the_session_are_refused(
    client: TestClient, settings: Settings, tmp_path: Path
):
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    (session_dir(settings) / "leak.txt").symlink_to(secret)
    (session_dir(settings) / "neighbour").symlink_to(session_dir(settings, "chat_neighbour"))
    assert client.get(f"/api/sessions/{RID}/assets/leak.txt").status_code == 404
    assert client.get(f"/api/sessions/{RID}/assets/neighbour/meta.json").status_code == 404
    (settings.data_dir / "sessions" / "chat_linked").symlink_to(session_dir(settings))
    assert client.get("/api/sessions/chat_linked").status_code == 404


@pytest.mark.parametrize("recording_id", ["chat_nobody", "..", "a%20b", "x" * 200])
def test_unknown_or_unsafe_ids_are_404_everywhere(client: TestClient, recording_id: str):
    base = f"/api/sessions/{recording_id}"
    for path in ["", "/recording", "/assets/meta.json", "/download", "/comment"]:
        assert client.get(base + path).status_code == 404, path
    assert client.post(f"{base}/comment", json={"comment": "x"}).status_code == 404
    assert client.post(f"{base}/upload-recording", content=WEBM).status_code == 404
    assert client.get(f"/s/{recording_id}").status_code == 404


def test_download_is_a_streamed_zip_of_every_file(client: TestClient, settings: Settings):
    directory = session_dir(settings)
    big = np.random.default_rng(1).bytes(3 * archive.PIECE_BYTES + 17)
    (directory / "user_videos" / "000.webm").write_bytes(big)
    response = client.get(f"/api/sessions/{RID}/download")
    assert response.status_code == 200 and response.headers["content-type"] == "application/zip"
    assert "content-length" not in response.headers, "streamed, not built whole"
    assert f'filename="{RID}.zip"' in response.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(response.content)) as zipped:
        assert zipped.testzip() is None
        names = set(zipped.namelist())
        on_disk = {
            f"{RID}/{p.relative_to(directory).as_posix()}"
            for p in directory.rglob("*")
            if p.is_file()
        }
        assert names == on_disk and f"{RID}/merged_replay.wav" in names
        assert zipped.read(f"{RID}/user_videos/000.webm") == big
    # The body is produced in pieces no bigger than one read of one file.
    pieces = list(archive.iter_zip(directory))
    assert len(pieces) > 4 and max(map(len, pieces)) <= archive.PIECE_BYTES + 4096


def test_upload_by_magic_bytes_with_a_size_cap(client: TestClient, settings: Settings):
    url = f"/api/sessions/{RID}/upload-recording"
    directory = session_dir(settings)
    ok = client.post(url, content=WEBM)
    assert ok.json() == {
        **{"status": "ok", "path": "frontend_replay.webm", "size_bytes": len(WEBM)},  # reference
        **{"success": True, "file": "frontend_replay.webm", "size": len(WEBM)},  # ours
    }
    assert (directory / "frontend_replay.webm").read_bytes() == WEBM
    assert client.post(url, content=MP4).json()["file"] == "frontend_replay.mp4"
    assert not (directory / "frontend_replay.webm").exists(), "one browser recording per session"
    assert client.post(url, content=WAV).json()["file"] == "frontend_replay.wav"
    assert client.post(url, content=b"<html>" + bytes(100)).status_code == 415
    assert client.post(url, content=b"").status_code == 415
    too_big = WEBM + bytes(11 * 1024)
    assert client.post(url, content=too_big).status_code == 413  # declared length

    def chunked() -> Iterator[bytes]:  # no Content-Length: caught while streaming
        yield WEBM
        for _ in range(12):
            yield bytes(1024)

    assert client.post(url, content=chunked()).status_code == 413
    assert (directory / "frontend_replay.wav").read_bytes() == WAV, "refusals change nothing"
    assert not list(directory.glob(".upload*")), "no partial uploads left behind"


def test_comments(client: TestClient, settings: Settings):
    url = f"/api/sessions/{RID}/comment"
    assert client.get(url).json()["comment"] == ""
    assert client.post(url, json={"comment": "great answer ✓"}).json()["success"] is True
    assert client.get(url).json()["comment"] == "great answer ✓"
    limit = settings.recording.max_comment_chars
    assert client.post(url, json={"comment": "x" * limit}).status_code == 200
    assert client.post(url, json={"comment": "x" * (limit + 1)}).status_code == 413
    assert client.post(url, json={"comment": 5}).status_code == 422
    assert client.get(url).json()["comment"] == "x" * limit
    # The reference's answer, its trimming, and a missing comment clearing it.
    assert client.post(url, json={"comment": "  ok  "}).json() | {"status": "ok", "len": 2} == (
        client.post(url, json={"comment": "  ok  "}).json()
    )
    assert client.get(url).json()["comment"] == "ok"
    assert client.post(url, json={"nope": 1}).json()["len"] == 0
    assert client.get(url).json()["comment"] == ""


def test_multipart_upload_as_the_reference_pages_send_it(client: TestClient, settings: Settings):
    """The reference's pages post FormData with the recording in ``file``."""
    directory = settings.data_dir / "sessions" / RID
    url = f"/api/sessions/{RID}/upload-recording"
    form = {"file": ("replay.webm", WEBM, "video/webm")}
    answer = client.post(url, files=form, data={"note": "x" * 100}).json()
    assert answer["status"] == "ok" and answer["size_bytes"] == len(WEBM)
    assert (directory / "frontend_replay.webm").read_bytes() == WEBM
    refused = client.post(url, files={"other": ("a.webm", WEBM, "video/webm")})
    assert refused.status_code == 422 and "file" in refused.json()["detail"]
    truncated = (b'--B\r\nContent-Disposition: form-data; name="file"; filename="r.webm"'
                 b"\r\n\r\n" + WEBM[:7])  # fmt: skip
    cut = client.post(
        url, content=truncated, headers={"content-type": "multipart/form-data; boundary=B"}
    )
    assert cut.status_code == 422 and "closing boundary" in cut.json()["error"], cut.text
    too_big = {"file": ("big.wav", WAV + bytes(2 * 1024 * 1024), "audio/wav")}
    assert client.post(url, files=too_big).status_code == 413
    assert (directory / "frontend_replay.webm").read_bytes() == WEBM, "refusals change nothing"
    assert not list(directory.glob(".upload*")), "no partial uploads left behind"


def test_head_on_an_asset(client: TestClient, settings: Settings):
    directory = settings.data_dir / "sessions" / RID
    (directory / "user_audio").mkdir(exist_ok=True)
    (directory / "user_audio" / "a.wav").write_bytes(WAV)
    head = client.head(f"/api/sessions/{RID}/assets/user_audio/a.wav")
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(WAV)
    assert head.content == b""
    assert client.head(f"/api/sessions/{RID}/assets/user_audio/none.wav").status_code == 404


def test_viewer_route(client: TestClient):
    page = client.get(f"/s/{RID}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f"/api/sessions/{RID}/download" in page.text
