"""Reference voices in process: uploads in every common format decoded and
stored, listed, served and deleted; size, duration and bad files refused."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from omnilive.audio import INPUT_RATE, read_wav, tone, wav_bytes
from omnilive.config import Settings, load_settings
from omnilive.gateway.routes import admin, voices
from omnilive.voices.store import VoiceStore
from tests.audio_files import FORMATS, encoded
from tests.gateway_app import gateway_app
from tests.speech import speak

MAX_S = 3.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    environ = {
        "OMNILIVE_VOICES__MAX_UPLOAD_MB": "0.5",
        "OMNILIVE_VOICES__MAX_DURATION_S": str(MAX_S),
    }
    return load_settings(None, environ, {"data_dir": tmp_path / "data", "engine": "scripted"})


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(gateway_app(settings, voices.router, admin.router)) as test_client:
        yield test_client


def upload(client: TestClient, data: bytes, filename: str, name: str | None = "mine") -> dict:
    fields = {"name": name} if name is not None else {}
    response = client.post("/api/assets/ref_audio", files={"file": (filename, data)}, data=fields)
    return {"status": response.status_code, **response.json()}


def pcm(body: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(body["base64"]), "<f4")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_upload_in_each_format_is_stored_as_16k_mono_wav(
    client: TestClient, settings: Settings, fmt: str
):
    clip = speak("Hello, this is my voice.")
    stored = upload(client, encoded(clip, fmt, INPUT_RATE), f"me.{fmt}", "My voice")
    assert stored["status"] == 201, stored
    assert stored["id"].startswith("voice_") and stored["name"] == "My voice"
    assert abs(stored["duration_s"] - clip.size / INPUT_RATE) < 0.1  # codec padding
    wav = settings.data_dir / "ref_audio" / f"{stored['id']}.wav"
    samples, rate = read_wav(wav.read_bytes())
    assert rate == INPUT_RATE and np.abs(samples).max() > 0.1
    listing = client.get("/api/assets/ref_audio").json()
    listed = listing["ref_audios"]
    assert listing["total"] == 1 and [v["id"] for v in listed] == [stored["id"]]
    assert set(listed[0]) == {
        *("id", "name", "filename", "source_type", "duration_ms", "sample_rate", "created_at"),
        "duration_s",  # ours
    }
    assert listed[0]["filename"] == f"{stored['id']}.wav" and listed[0]["source_type"] == "upload"
    assert listed[0]["duration_ms"] == round(stored["duration_s"] * 1000)
    assert datetime.fromisoformat(listed[0]["created_at"]).tzinfo is not None
    assert stored["success"] is True and "duration=" in stored["message"]
    served = client.get(f"/api/assets/ref_audio/{stored['id']}/audio").json()
    assert served["sample_rate"] == INPUT_RATE and served["duration_s"] == stored["duration_s"]
    assert np.abs(pcm(served)).max() > 0.1


def test_other_rates_and_stereo_are_converted(client: TestClient):
    stereo = np.stack([tone(1.5, 44_100, 300), tone(1.5, 44_100, 500)], axis=1)
    stored = upload(client, wav_bytes(stereo, 44_100, channels=2), "stereo.wav")
    assert stored["status"] == 201 and abs(stored["duration_s"] - 1.5) < 0.01


def test_delete_removes_the_voice_and_its_file(client: TestClient, settings: Settings):
    stored = upload(client, encoded(tone(1.0, INPUT_RATE, 440), "wav"), "a.wav")
    kept = upload(client, encoded(tone(1.0, INPUT_RATE, 440), "wav"), "b.wav")
    response = client.delete(f"/api/assets/ref_audio/{stored['id']}")
    assert response.status_code == 200 and response.json()["deleted"]["id"] == stored["id"]
    assert response.json()["success"] is True and response.json()["id"] == stored["id"]
    assert not (settings.data_dir / "ref_audio" / f"{stored['id']}.wav").exists()
    listed = client.get("/api/assets/ref_audio").json()["ref_audios"]
    assert [v["id"] for v in listed] == [kept["id"]]
    assert client.get(f"/api/assets/ref_audio/{stored['id']}/audio").status_code == 404
    assert client.delete(f"/api/assets/ref_audio/{stored['id']}").status_code == 404
    assert client.delete("/api/assets/ref_audio/..%2F..%2Fetc").status_code == 404


def test_name_defaults_to_the_file_name_and_is_cleaned(client: TestClient):
    clip = encoded(tone(1.0, INPUT_RATE, 440), "wav")
    assert upload(client, clip, "Grandma Rose.wav", None)["name"] == "Grandma Rose"
    assert upload(client, clip, "x.wav", "  a\x00b\n  c " + "z" * 200)["name"].startswith("ab c")


def test_size_cap(client: TestClient):
    big = encoded(np.zeros(int(0.6 * 1024 * 1024 / 2), np.float32), "wav")  # 0.6 MB
    refused = upload(client, big, "big.wav")
    assert refused["status"] == 413 and refused["code"] == "payload_too_large"
    assert client.get("/api/assets/ref_audio").json()["ref_audios"] == []


def test_duration_caps(client: TestClient):
    long = upload(client, encoded(tone(MAX_S + 1, INPUT_RATE, 440), "mp3"), "long.mp3")
    assert long["status"] == 422 and long["code"] == "audio_too_long", long
    short = upload(client, encoded(tone(0.2, INPUT_RATE, 440), "wav"), "short.wav")
    assert short["status"] == 422 and short["code"] == "audio_too_short", short


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"this is not audio at all" * 40,
        b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(200),
        # A playlist pointing at a local file must never be followed.
        b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n",
        b"ffconcat version 1.0\nfile '/etc/passwd'\n",
    ],
)
def test_undecodable_files_are_refused(client: TestClient, data: bytes):
    refused = upload(client, data, "voice.wav")
    assert refused["status"] == 422 and refused["code"] == "undecodable_audio", refused
    assert refused["error"]
    # the server's temporary file is not named to the client
    assert "omnilive-audio-" not in refused["error"] and tempfile.gettempdir() not in str(refused)


def test_a_form_without_a_file_is_refused(client: TestClient):
    response = client.post("/api/assets/ref_audio", data={"name": "x"})
    assert response.status_code == 422 and response.json()["code"] == "invalid_request"
    response = client.post("/api/assets/ref_audio", content=b"raw bytes")
    assert response.status_code == 422


def test_store_count_cap(tmp_path: Path):
    store = VoiceStore(tmp_path)
    store.add(tone(1.0, INPUT_RATE, 440), "one", max_count=1)
    with pytest.raises(RuntimeError):
        store.add(tone(1.0, INPUT_RATE, 440), "two", max_count=1)


def test_default_ref_audio_is_a_spoken_sample(client: TestClient):
    body = client.get("/api/default_ref_audio").json()
    assert body["sample_rate"] == INPUT_RATE and body["name"] == "espeak-ng en-us"
    audio = pcm(body)
    assert audio.size / INPUT_RATE == pytest.approx(body["duration_s"], abs=0.01)
    assert body["duration_s"] > 1 and np.abs(audio).max() > 0.1
    # The reference's fields: samples, and the duration to one decimal.
    assert body["samples"] == audio.size and body["duration"] == round(body["duration_s"], 1)


def test_json_upload_as_the_reference_takes_it(client: TestClient, settings: Settings):
    clip = encoded(speak("This is my voice."), "mp3", INPUT_RATE)
    response = client.post(
        "/api/assets/ref_audio",
        json={"name": "Mine", "audio_base64": base64.b64encode(clip).decode()},
    )
    answer = response.json()
    assert response.status_code == 201 and answer["success"] is True and answer["name"] == "Mine"
    assert (settings.data_dir / "ref_audio" / f"{answer['id']}.wav").exists()
    bad = client.post("/api/assets/ref_audio", json={"name": "x", "audio_base64": "!!"})
    assert bad.status_code == 422 and "audio_base64" in bad.json()["detail"]
    noise = base64.b64encode(b"not audio" * 100).decode()
    refused = client.post("/api/assets/ref_audio", json={"audio_base64": noise})
    assert refused.status_code == 422 and refused.json()["code"] == "undecodable_audio"


def test_default_ref_audio_of_minicpmo_is_its_configured_wav(tmp_path: Path):
    reference = tmp_path / "teacher.wav"
    reference.write_bytes(encoded(tone(2.0, 24_000, 300), "wav", 24_000))
    settings = load_settings(
        None,
        {},
        {"data_dir": tmp_path / "d", "engine": "minicpmo", "minicpmo.default_voice": reference},
    )
    with TestClient(gateway_app(settings, voices.router)) as client:
        body = client.get("/api/default_ref_audio").json()
    assert body["name"] == "teacher" and body["duration_s"] == pytest.approx(2.0, abs=0.01)
