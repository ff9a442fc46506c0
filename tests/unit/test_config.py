from pathlib import Path

import pytest
from pydantic import ValidationError

from omnilive.config import Settings, load_settings


def test_spec_defaults():
    s = Settings()
    assert (s.port, s.worker_base_port, s.max_queue_size, s.request_timeout_s) == (
        8006,
        22400,
        1000,
        300,
    )
    assert (s.eta.chat_s, s.eta.half_duplex_s, s.eta.audio_duplex_s, s.eta.omni_duplex_s) == (
        15,
        180,
        120,
        90,
    )
    assert (s.eta.ema_alpha, s.eta.ema_min_samples) == (0.3, 3)
    assert s.data_dir == Path("data")
    assert s.engine == "cascade"


def test_precedence_file_then_env_then_flags(tmp_path: Path):
    config = tmp_path / "omnilive.toml"
    config.write_text('port = 9000\nworkers = 2\nengine = "scripted"\n[eta]\nchat_s = 20\n')
    env = {"OMNILIVE_PORT": "9100", "OMNILIVE_ETA__OMNI_DUPLEX_S": "33"}
    s = load_settings(config, env, {"port": None, "workers": 4})
    assert s.port == 9100  # env beats file
    assert s.workers == 4  # flag beats file
    assert s.engine == "scripted"  # file beats default
    assert s.eta.chat_s == 20 and s.eta.omni_duplex_s == 33
    assert load_settings(config, env, {"port": 9200}).port == 9200  # flag beats env


def test_worker_urls_from_env():
    s = load_settings(None, {"OMNILIVE_WORKER_URLS": "http://a:1,http://b:2"})
    assert s.worker_urls == ["http://a:1", "http://b:2"]


def test_unknown_keys_and_bad_values_are_errors(tmp_path: Path):
    config = tmp_path / "bad.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(ValidationError):
        load_settings(config, {})
    with pytest.raises(ValidationError):
        load_settings(None, {"OMNILIVE_PORT": "not-a-port"})


def test_media_processes_follow_the_host_s_cores_unless_set():
    auto = load_settings(environ={}).webrtc
    assert auto.media_processes == "auto"
    assert [auto.media_process_count(cpus) for cpus in (1, 2, 3, 4, 16, 64)] == [0, 0, 1, 2, 8, 32]

    def webrtc(count: str):
        return load_settings(environ={"OMNILIVE_WEBRTC__MEDIA_PROCESSES": count}).webrtc

    assert webrtc("3").media_process_count(2) == 3
    assert webrtc("0").media_process_count(64) == 0
    with pytest.raises(ValidationError):
        load_settings(environ={"OMNILIVE_WEBRTC__MEDIA_PROCESSES": "many"})
