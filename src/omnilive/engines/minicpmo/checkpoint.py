"""Checks a MiniCPM-o checkpoint directory before anything heavy is imported.

Loading 18 GB of weights only to fail on a missing shard wastes minutes of a
GPU; these checks read nothing but file names, sizes and two small JSON files,
so a bad ``--model-path`` is reported at once, in words, even on a machine
without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnilive.engines.base import EngineUnavailable

# Either the fast tokenizer file or the byte-level BPE pair it is built from.
_TOKENIZER_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"))
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class CheckpointError(EngineUnavailable):
    """The checkpoint directory is missing, incomplete or malformed."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What the checks learned: where the weights are and how large they are."""

    path: Path
    config: dict[str, Any]
    weight_files: tuple[Path, ...]
    weight_bytes: int
    code_files: tuple[Path, ...] = field(default=())

    @property
    def weight_gib(self) -> float:
        return self.weight_bytes / 2**30


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint file {path} holds no JSON object")
    return data


def _code_files(path: Path, config: dict[str, Any]) -> tuple[Path, ...]:
    """The model's own Python modules that ``trust_remote_code`` will import."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or "AutoModel" not in auto_map:
        raise CheckpointError(
            f"{path / 'config.json'} has no auto_map.AutoModel: the checkpoint must ship "
            "its model code (trust_remote_code)"
        )
    modules = set()
    for target in auto_map.values():
        reference = target[0] if isinstance(target, list) else target
        if isinstance(reference, str) and "." in reference and "--" not in reference:
            modules.add(reference.rsplit(".", 1)[0] + ".py")
    files = tuple(path / name for name in sorted(modules))
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks its model code: {', '.join(missing)}")
    return files


def _weight_files(path: Path) -> tuple[Path, ...]:
    for index_name in _WEIGHT_INDEXES:
        index = path / index_name
        if index.is_file():
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index} has no weight_map")
            shards = tuple(path / name for name in sorted(set(weight_map.values())))
            missing = [s.name for s in shards if not s.is_file() or s.stat().st_size == 0]
            if missing:
                shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
                raise CheckpointError(
                    f"checkpoint {path} is incomplete: {len(missing)} of {len(shards)} "
                    f"weight shards missing or empty ({shown})"
                )
            return shards
    for name in _SINGLE_WEIGHTS:
        single = path / name
        if single.is_file() and single.stat().st_size > 0:
            return (single,)
    expected = " or ".join(_WEIGHT_INDEXES + _SINGLE_WEIGHTS)
    raise CheckpointError(f"checkpoint {path} has no weights (expected {expected})")


def inspect_checkpoint(path: Path | None) -> CheckpointInfo:
    """Raise :class:`CheckpointError` naming the first thing that is wrong."""
    if path is None:
        raise CheckpointError(
            "the minicpmo engine needs a checkpoint: pass --model-path DIR "
            "(or set OMNILIVE_MINICPMO__MODEL_PATH)"
        )
    path = path.expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is not a directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"checkpoint {path} has no config.json")
    config = _read_json(config_file)
    code = _code_files(path, config)
    if not any(all((path / n).is_file() for n in names) for names in _TOKENIZER_SETS):
        raise CheckpointError(
            f"checkpoint {path} has no tokenizer (tokenizer.json, or vocab.json + merges.txt)"
        )
    if not (path / "preprocessor_config.json").is_file():
        raise CheckpointError(f"checkpoint {path} has no preprocessor_config.json")
    weights = _weight_files(path)
    return CheckpointInfo(
        path=path,
        config=config,
        weight_files=weights,
        weight_bytes=sum(f.stat().st_size for f in weights),
        code_files=code,
    )
