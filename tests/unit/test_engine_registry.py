"""The engine registry: the one list of engines the settings, the command line
and create_engine read, and the process-wide knobs each engine sets when it
loads (never on import)."""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from omnilive.cli import build_parser
from omnilive.config import Settings
from omnilive.engines import ENGINE_NAMES, ENGINES, create_engine
from omnilive.engines.cascade import CascadeEngine
from omnilive.engines.cascade.llm import OPENMP_SPIN_COUNT


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_settings_accept_exactly_the_registered_engines():
    assert ENGINE_NAMES == tuple(ENGINES) == ("cascade", "scripted", "minicpmo")
    annotation = Settings.model_fields["engine"].annotation
    assert typing.get_args(annotation) == ENGINE_NAMES
    for name in ENGINE_NAMES:
        assert Settings(engine=name).engine == name


def test_the_command_line_offers_exactly_the_registered_engines():
    parser = build_parser()
    for command in ("serve", "gateway", "worker"):
        assert parser.parse_args([command, "--engine", "scripted"]).engine == "scripted"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--engine", "nope"])


def test_an_unknown_engine_in_the_settings_lists_the_known_ones():
    with pytest.raises(ValidationError, match="'cascade', 'scripted' or 'minicpmo'"):
        Settings(engine="nope")


def test_create_engine_on_an_unknown_name_names_it_and_the_known_ones():
    settings = Settings.model_construct(engine="nope")  # past validation, as a caller could
    with pytest.raises(ValueError, match=r"unknown engine 'nope' \(known engines: cascade, "):
        create_engine(settings)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_each_entry_builds_its_engine_without_loading_it(name: str, tmp_path: Path):
    engine = create_engine(Settings(engine=name, data_dir=tmp_path))
    assert engine.name == name
    assert list(tmp_path.iterdir()) == []  # built, not loaded: no model fetched


def test_reading_the_settings_and_building_the_scripted_engine_imports_no_model_engine():
    found = _run(
        "import sys; from omnilive.config import Settings; from omnilive.engines import "
        "create_engine; create_engine(Settings(engine='scripted')); "
        "print(sorted(m for m in sys.modules if m.startswith(('omnilive.engines.cascade', "
        "'omnilive.engines.minicpmo', 'llama_cpp', 'faster_whisper', 'torch'))))"
    )
    assert found == "[]"


def test_importing_the_cascade_engine_leaves_the_environment_alone():
    found = _run(
        "import os; os.environ.pop('GOMP_SPINCOUNT', None); import omnilive.engines.cascade; "
        "import omnilive.worker.app; print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    assert found == "None"


class _Stop(Exception):
    pass


def _load_until_the_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CascadeEngine.load, stopped where it would fetch the models."""

    def stop(*_args: object) -> None:
        raise _Stop

    monkeypatch.setattr("omnilive.engines.cascade.engine.prepare_models", stop)
    engine = create_engine(Settings(engine="cascade", data_dir=tmp_path))
    assert isinstance(engine, CascadeEngine)
    with pytest.raises(_Stop):
        engine.load(lambda _stage, _fraction: None)


def test_the_cascade_engine_sets_the_openmp_spin_first_in_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    _load_until_the_models(monkeypatch, tmp_path)
    assert os.environ["GOMP_SPINCOUNT"] == OPENMP_SPIN_COUNT


def test_an_openmp_spin_the_operator_set_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("GOMP_SPINCOUNT", "50")
    _load_until_the_models(monkeypatch, tmp_path)
    assert os.environ["GOMP_SPINCOUNT"] == "50"


def test_a_ray_worker_asks_for_the_gpus_its_engine_is_registered_with():
    ray = Settings().ray
    assert {name: ray.gpus_per_worker(name) for name in ENGINE_NAMES} == {
        "cascade": 0.0,
        "scripted": 0.0,
        "minicpmo": 1.0,
    }
    assert Settings(ray={"worker_gpus": 0.5}).ray.gpus_per_worker("minicpmo") == 0.5
