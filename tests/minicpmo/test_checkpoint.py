"""The checkpoint is checked file by file before anything heavy is imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnilive.engines.minicpmo.checkpoint import CheckpointError, inspect_checkpoint
from tests.minicpmo.conftest import write_checkpoint


def error_of(path: Path | None) -> str:
    with pytest.raises(CheckpointError) as caught:
        inspect_checkpoint(path)
    return str(caught.value)


def test_a_complete_checkpoint_is_described(checkpoint: Path):
    info = inspect_checkpoint(checkpoint)
    assert len(info.weight_files) == 2 and info.weight_bytes == 2048
    assert {f.name for f in info.code_files} == {
        "configuration_minicpmo.py",
        "modeling_minicpmo.py",
    }


def test_no_path_and_missing_directory(tmp_path: Path):
    assert "--model-path" in error_of(None)
    assert "does not exist" in error_of(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    assert "not a directory" in error_of(tmp_path / "file")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: (p / "config.json").unlink(), "no config.json"),
        (lambda p: (p / "config.json").write_text("{not json"), "not readable JSON"),
        (lambda p: (p / "config.json").write_text("{}"), "auto_map.AutoModel"),
        (
            lambda p: (p / "modeling_minicpmo.py").unlink(),
            "lacks its model code: modeling_minicpmo.py",
        ),
        (lambda p: (p / "merges.txt").unlink(), "no tokenizer"),
        (lambda p: (p / "preprocessor_config.json").unlink(), "preprocessor_config.json"),
        (lambda p: (p / "model-00002-of-00002.safetensors").unlink(), "1 of 2 weight shards"),
        (lambda p: (p / "model-00001-of-00002.safetensors").write_bytes(b""), "missing or empty"),
        (lambda p: (p / "model.safetensors.index.json").unlink(), "has no weights"),
    ],
)
def test_each_missing_piece_is_named(checkpoint: Path, damage, expected: str):
    damage(checkpoint)
    assert expected in error_of(checkpoint)


def test_a_single_file_checkpoint_and_a_fast_tokenizer(tmp_path: Path):
    path = write_checkpoint(tmp_path / "single", shards=1)
    (path / "model.safetensors.index.json").unlink()
    (path / "model-00001-of-00001.safetensors").rename(path / "model.safetensors")
    (path / "vocab.json").unlink()
    (path / "merges.txt").unlink()
    (path / "tokenizer.json").write_text(json.dumps({}))
    assert [f.name for f in inspect_checkpoint(path).weight_files] == ["model.safetensors"]
