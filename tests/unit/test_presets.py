"""Presets: the built-in set, users' folders merged over it, the API, and
their audio made by espeak-ng (cached) or read from files."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from omnilive.audio import INPUT_RATE, tone
from omnilive.config import Settings, load_settings
from omnilive.gateway.routes import presets
from omnilive.presets.audio import PresetAudioError, render
from omnilive.presets.catalog import PresetCatalog, read_preset
from omnilive.voices.speech import SpeechCache
from tests.audio_files import encoded
from tests.gateway_app import gateway_app


def pcm(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), "<f4")


def test_the_builtin_set():
    catalog = PresetCatalog().load()
    ids = {mode: [f.preset.id for f in files] for mode, files in catalog.items()}
    assert ids == {
        "turnbased": ["assistant_en", "assistant_zh"],
        "half_duplex": ["assistant_en", "assistant_zh", "phone_call"],
        "audio_duplex": ["assistant_en", "assistant_zh", "phone_call"],
        "omni": ["assistant_en", "assistant_zh", "video_analyst"],
    }
    for files in catalog.values():
        for found in files:
            assert found.preset.name and found.preset.name_zh and found.preset.text
            assert found.preset.voice is not None


def write(folder: Path, mode: str, name: str, text: str) -> Path:
    (folder / mode).mkdir(parents=True, exist_ok=True)
    path = folder / mode / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    # replaces the built-in English assistant of turn-based chat
    write(folder, "turnbased", "assistant_en.yaml", "name: My English\norder: 99\n"
          "system_prompt: Talk like a pirate.\nvoice: {name: en-gb}\n")  # fmt: skip
    (folder / "audio_duplex" / "voices").mkdir(parents=True)
    (folder / "audio_duplex" / "voices" / "me.mp3").write_bytes(
        encoded(tone(1.5, INPUT_RATE, 330), "mp3")
    )
    write(folder, "audio_duplex", "mine.yaml", """
id: my_voice
name: My own voice
order: 1
system_prompt:
  - {type: text, text: Hello.}
  - {type: audio, file: voices/me.mp3}
voice: {file: voices/me.mp3}
""")  # fmt: skip
    write(folder, "omni", "broken.yaml", "name: [unclosed\n")
    write(folder, "omni", "wrong.yaml", "name: x\nvoice: {name: a, file: b}\n")
    write(folder, "half_duplex", "escape.yaml", "name: x\nvoice: {file: ../../../etc/passwd}\n")
    return folder


def test_user_folders_override_and_extend(user_dir: Path):
    catalog = PresetCatalog([user_dir]).load()
    english = next(f for f in catalog["turnbased"] if f.preset.id == "assistant_en")
    assert english.summary() == {
        "id": "assistant_en", "name": "My English", "name_zh": None, "order": 99,
        "description": "", "system_prompt": "Talk like a pirate.",
        "system_content": [{"type": "text", "text": "Talk like a pirate."}],
        "has_audio": False, "voice": {"name": "en-gb"},
    }  # fmt: skip
    assert [f.preset.id for f in catalog["turnbased"]] == ["assistant_zh", "assistant_en"]
    assert catalog["audio_duplex"][0].preset.id == "my_voice"
    assert [f.preset.id for f in catalog["omni"]] == ["assistant_en", "assistant_zh",
                                                      "video_analyst"]  # fmt: skip
    audio = render(catalog["audio_duplex"][0], SpeechCache(user_dir / "cache"), Settings().voices)
    assert len(audio.system) == 1 and abs(audio.system[0].size / INPUT_RATE - 1.5) < 0.1
    assert audio.voice is not None and np.abs(audio.voice).max() > 0.1
    escape = next(f for f in catalog["half_duplex"] if f.preset.id == "escape")
    with pytest.raises(PresetAudioError):
        render(escape, SpeechCache(user_dir / "cache"), Settings().voices)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: x\nid: ../x\n", "id"),
        ("name: x\nsystem_prompt: [{type: audio}]\n", "speak or file"),
        ("name: x\nsystem_prompt: [{type: audio, speak: hi, voice: 'en; rm -rf'}]\n", "espeak"),
        ("name: x\nsurprise: 1\n", "surprise"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_preset_files_say_what_is_wrong(tmp_path: Path, text: str, problem: str):
    path = write(tmp_path, "omni", "p.yaml", text)
    with pytest.raises(ValueError, match=problem):
        read_preset(path)


def test_spoken_audio_is_made_once_and_cached(tmp_path: Path):
    cache = SpeechCache(tmp_path)
    first = cache.speech("Hello there.", "en-us")
    assert len(list(tmp_path.glob("*.wav"))) == 1
    again = cache.speech("Hello there.", "en-us")
    assert np.abs(first - again).max() < 1e-3 and np.abs(first).max() > 0.1


@pytest.fixture
def settings(tmp_path: Path, user_dir: Path) -> Settings:
    return load_settings(
        None, {"OMNILIVE_PRESETS__DIRS": str(user_dir)}, {"data_dir": tmp_path / "data"}
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(gateway_app(settings, presets.router)) as test_client:
        yield test_client


def test_api_lists_every_mode_without_audio(client: TestClient):
    """Keyed by the reference's mode folders, items in its shape (``system_content``
    with audio placeholders, ``ref_audio``) and ours (``has_audio``, ``voice``)."""
    body = client.get("/api/presets").json()
    assert list(body) == ["turnbased", "half_duplex_audio", "audio_duplex", "omni"]
    first = body["half_duplex_audio"][0]
    assert first["id"] == "assistant_en" and first["has_audio"] is True
    assert first["voice"] == {"has_audio": True}
    assert "Clone the voice" in first["system_prompt"] and "audio" not in first
    text, spoken, rest = first["system_content"]
    assert text == {"type": "text", "text": "Clone the voice in the provided audio prompt."}
    assert spoken["type"] == "audio" and spoken["data"] is None
    assert spoken["path"] == "half_duplex/assistant_en/system/0" and spoken["duration"] > 1
    assert rest["type"] == "text"
    assert first["ref_audio"]["data"] is None and first["ref_audio"]["duration"] > 1
    assert body["audio_duplex"][0]["id"] == "my_voice"
    assert [p["order"] for p in body["omni"]] == sorted(p["order"] for p in body["omni"])


@pytest.mark.parametrize(
    ("mode", "preset_id", "n_system"),
    [("half_duplex", "assistant_zh", 1), ("omni", "video_analyst", 0), ("turnbased",
     "assistant_en", 0)],
)  # fmt: skip
def test_api_serves_preset_audio(
    client: TestClient, settings: Settings, mode: str, preset_id: str, n_system: int
):
    body = client.get(f"/api/presets/{mode}/{preset_id}/audio").json()
    assert body["sample_rate"] == INPUT_RATE
    assert len(body.get("system_content_audio", [])) == n_system  # present only if any
    for clip in body.get("system_content_audio", []):
        assert np.abs(pcm(clip["data"])).max() > 0.1 and pcm(clip["data"]).size > INPUT_RATE
        assert clip["duration"] == round(pcm(clip["data"]).size / INPUT_RATE, 1)
    if mode == "turnbased":  # the user's version: a named voice, no audio
        assert "ref_audio" not in body
    else:
        assert np.abs(pcm(body["ref_audio"]["data"])).max() > 0.1
        assert body["ref_audio"]["name"] == f"{preset_id}-voice.wav"
        assert any((settings.data_dir / "cache" / "presets").glob("*.wav"))


def test_api_takes_the_reference_name_of_half_duplex(client: TestClient):
    ours = client.get("/api/presets/half_duplex/assistant_zh/audio").json()
    theirs = client.get("/api/presets/half_duplex_audio/assistant_zh/audio").json()
    [clip] = theirs["system_content_audio"]
    assert [(c["name"], c["duration"]) for c in ours["system_content_audio"]] == [
        (clip["name"], clip["duration"])
    ]


def test_api_answers_404_for_unknown_presets(client: TestClient):
    for path in ("omni/nope", "nomode/assistant_en"):
        response = client.get(f"/api/presets/{path}/audio")
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert client.get("/api/presets/omni/..%2F..%2Fturnbased/audio").status_code == 404


def test_preset_folders_come_from_the_environment_like_path():
    environ = {"OMNILIVE_PRESETS__DIRS": "/a/one:/b/two"}
    assert load_settings(None, environ).presets.dirs == [Path("/a/one"), Path("/b/two")]
    environ = {"OMNILIVE_PRESETS__DIRS": '["/c"]'}
    assert load_settings(None, environ).presets.dirs == [Path("/c")]
