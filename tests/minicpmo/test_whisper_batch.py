"""The duplex sessions' streaming Whisper encoder, batched across sessions
(whisper_batch.py), against the model code's ``get_audio_embedding_streaming``
one session at a time, on the CPU with the tiny checkpoint of the published
architecture. Skipped where the model code is not at hand (``model_code.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code


@pytest.fixture(scope="module")
def shared(tiny_shared: Any) -> Any:
    return tiny_shared


def run(shared: Any, starts: list[int], rounds: int) -> tuple[int, float, int]:
    """Sessions starting at ``starts`` (rounds), each sent a second of its
    own noise a round: every round's chunks batched, against each session
    alone through the model code. Returns the chunks compared, the largest
    difference and the largest batch."""
    from omnilive.engines.minicpmo.sessions.encoders.units import (
        AudioStream,
        audio_embeddings,
        audio_embeddings_together,
        audio_features,
    )
    from omnilive.engines.minicpmo.sessions.encoders.whisper_batch import batchable

    assert batchable(shared.model)
    alone = [AudioStream(mel=shared.new_mel()) for _ in starts]
    together = [AudioStream(mel=None) for _ in starts]
    rngs = [np.random.default_rng(index) for index in range(len(starts))]
    compared, largest, widest = 0, 0.0, 0
    for round_ in range(rounds):
        items, expected = [], []
        for index, start in enumerate(starts):
            if round_ < start:
                continue
            audio = rngs[index].normal(0, 0.1, 16_000).astype(np.float32)
            feature = audio_features(shared, alone[index], audio)
            if feature is None:
                continue
            expected.append(audio_embeddings(shared, alone[index], feature))
            items.append((together[index], feature))
        if not items:
            continue
        widest = max(widest, len(items))
        for got, want in zip(audio_embeddings_together(shared, items), expected, strict=True):
            assert got.shape == want.shape
            largest = max(largest, float((got - want).abs().max()))
            compared += 1
    return compared, largest, widest


def test_sessions_at_different_points_encode_together_as_each_alone(shared: Any) -> None:
    compared, largest, widest = run(shared, starts=[0, 2, 3, 5], rounds=9)
    assert compared == 9 + 7 + 6 + 4
    assert widest == 4
    assert largest < 1e-4


def test_a_cache_reaching_the_position_table_starts_over_as_the_model_code_does(
    shared: Any,
) -> None:
    table = int(shared.model.apm.embed_positions.weight.shape[0])
    rounds = table // 50 + 3  # 50 positions a second: past the table's end
    compared, largest, _ = run(shared, starts=[0, 1], rounds=rounds)
    assert compared == 2 * rounds - 1
    assert largest < 1e-4


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="CUDA graphs need a GPU")
def test_the_graphs_between_attentions_give_the_eager_encoders_embeddings_to_the_bit(
    tiny_checkpoint: Path,
) -> None:
    # On CUDA, Whisper runs as graphs between its attentions (whisper_graphs.py):
    # sessions joining at different rounds give batches of 1 to 3 rows, each
    # shape eager at first, then captured, then replayed; past the position
    # table's end the caches start over. Embeddings and caches equal the eager
    # encoder's exactly.
    import torch
    from benchmarks.duplex_equality import load_reference

    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.encoders.units import (
        AudioStream,
        audio_embeddings_together,
        audio_features,
    )
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

    owner = load_reference(tiny_checkpoint, "unified", "cuda", "bfloat16", budget=8, forced=0)
    cuda = SharedModel.of_duplex(owner, UnitRules())
    cuda.encoder_graphs = True  # minicpmo.encoder_graphs
    assert cuda.audio_graphs() is not None
    starts = [0, 1, 3]
    mels = [AudioStream(mel=cuda.new_mel()) for _ in starts]
    graphed = [AudioStream(mel=None) for _ in starts]
    eager = [AudioStream(mel=None) for _ in starts]
    rngs = [np.random.default_rng(index) for index in range(len(starts))]
    table = int(cuda.model.apm.embed_positions.weight.shape[0])
    compared = 0
    for round_ in range(table // 50 + 4):
        features = {}
        for index, start in enumerate(starts):
            if round_ >= start:
                audio = rngs[index].normal(0, 0.1, 16_000).astype(np.float32)
                feature = audio_features(cuda, mels[index], audio)
                if feature is not None:
                    features[index] = feature
        if not features:
            continue
        with torch.no_grad():
            got = audio_embeddings_together(cuda, [(graphed[i], f) for i, f in features.items()])
            want = audio_embeddings_together(
                cuda, [(eager[i], f) for i, f in features.items()], graphs=False
            )
        for mine, theirs in zip(got, want, strict=True):
            assert torch.equal(mine, theirs)
            compared += 1
    for mine, theirs in zip(graphed, eager, strict=True):
        pairs = zip(mine.whisper_kv.keys + mine.whisper_kv.values,
                    theirs.whisper_kv.keys + theirs.whisper_kv.values, strict=True)  # fmt: skip
        assert all(torch.equal(a, b) for a, b in pairs)
    stats = cuda.lane_graphs()["whisper"]
    assert compared > 20 and stats["captures"] >= 2 and stats["eager"] >= 2
