"""A simplex answer's speech tokens chosen together (chunk_speech_choice.py):
the one kernel (in Triton's interpreter here, compiled on a GPU) against the
tensor rule, bit for bit; rows of a batch as each alone. The rule itself is
held to transformers' warpers in test_simplex_rules.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from omnilive.engines.minicpmo.runtime import kernels
from omnilive.engines.minicpmo.sessions.duplex.unit_rules import (
    SPEECH_PENALTY_WINDOW as DUPLEX_WINDOW,
)
from omnilive.engines.minicpmo.sessions.sampling import ANSWER_SPEECH
from omnilive.engines.minicpmo.sessions.simplex.rules import SPEECH_PENALTY_WINDOW
from omnilive.engines.minicpmo.sessions.simplex.speech_choice import (
    COLUMNS,
    SpeechRow,
    choose_chunk_fused,
    choose_chunk_rows,
    choose_chunk_speech_token,
    choose_chunk_speech_tokens,
    table_row,
    unfiltered_scores,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_rows(seed: int, size: int, count: int = 12) -> list[SpeechRow]:
    """Rows of every kind, each setting drawn on its own: near-greedy and
    sampled temperatures, with and without top-p, top-k (small, none, past
    the vocabulary), penalties, min_kept of 0, 1 and 3; bf16 logits (many
    equal), flat and peaked (where top-p's cut reaches the min_kept best)."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(count):
        scale = float(rng.choice([0.5, 2.0, 8.0, 30.0]))
        logits = torch.from_numpy(rng.normal(0, scale, size).astype(np.float32))
        logits = logits.to(torch.bfloat16)
        logits[:4] = logits[4]  # ties
        sampling = replace(
            ANSWER_SPEECH,
            temperature=float(rng.choice([0.8, 1e-6, 1.0, 0.3])),
            top_p=float(rng.choice([0.85, 1.0, 0.5, 0.99])),
            top_k=int(rng.choice([25, 0, 3, 10_000])),
            repetition_penalty=float(rng.choice([1.05, 1.5, 1.0])),
            min_kept=int(rng.choice([3, 0, 1])),
        )
        previous = [int(t) for t in rng.integers(0, 40, 5 * (k % 4))] or None
        generator = torch.Generator().manual_seed(seed * 100 + k)
        rows.append(SpeechRow(logits.to(DEVICE), previous, sampling, generator))
    return rows


def kernel_and_rule(rows: list[SpeechRow], size: int) -> None:
    """The kernel's tokens and scores are the tensor rule's."""
    logits = torch.stack([row.logits for row in rows])
    table = torch.tensor([table_row(row, size) for row in rows], dtype=torch.float64)
    table = table.to(DEVICE)
    tokens, scores = choose_chunk_fused(logits, table)
    expected_tokens, expected_scores = choose_chunk_rows(logits, table)
    assert torch.equal(scores, expected_scores)
    assert tokens.tolist() == expected_tokens.tolist()


@pytest.mark.skipif(not kernels.AVAILABLE, reason="Triton is not installed")
# Sizes at a power of two and between two (the block pads to the next one);
# the interpreter's time grows with the block: 300 (a block of 512) took ~21
# CPU-seconds, 100 ~5.
@pytest.mark.parametrize(("seed", "size"), [(1, 100), (2, 64), (3, 200)])
def test_the_kernel_chooses_as_the_tensor_rule(seed: int, size: int) -> None:
    kernel_and_rule(random_rows(seed, size), size)


@pytest.mark.skipif(not kernels.AVAILABLE, reason="Triton is not installed")
def test_equal_scores_keep_their_ids_order_minus_zero_included() -> None:
    """Top-p adds up from the bottom in a stable order, where -0 equals 0:
    of the two zeros here the cut falls between, the first by id goes."""
    logits = torch.tensor([0.0, -0.0, 10.0, 10.0, 10.0])
    probability = float(np.exp(-10.0) / (3 + 2 * np.exp(-10.0)))
    sampling = replace(ANSWER_SPEECH, temperature=1.0, top_p=1 - 1.5 * probability, min_kept=1)
    rows = [SpeechRow(logits.to(DEVICE), None, sampling, torch.Generator().manual_seed(0))]
    _, scores = choose_chunk_speech_tokens(rows)
    assert np.isfinite(scores[0].cpu().numpy()).tolist() == [False, True, True, True, True]
    kernel_and_rule(rows, 5)


@pytest.mark.parametrize("seed", range(3))
def test_rows_chosen_together_are_chosen_as_each_alone(seed: int) -> None:
    together = random_rows(seed, 300)
    tokens, scores = choose_chunk_speech_tokens(together)
    for k, row in enumerate(random_rows(seed, 300)):  # fresh generators
        token, alone = choose_chunk_speech_token(*row)
        assert token == tokens[k]
        assert np.array_equal(scores[k].cpu().numpy(), alone)


def test_top_k_keeps_every_token_tied_with_its_last() -> None:
    logits = torch.tensor([5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, -1.0])
    sampling = replace(ANSWER_SPEECH, temperature=1.0, top_p=1.0, top_k=3, min_kept=1)
    _, scores = choose_chunk_speech_token(logits, None, sampling)
    assert np.isfinite(scores).tolist() == [True] * 5 + [False] * 3


def test_unfiltered_scores_are_the_chosen_ones_before_top_p_and_top_k() -> None:
    """What the equality harness measures a near-tie in: every token's
    tempered, penalised score, where the choice keeps only the best; no
    uniform number is drawn for it."""
    logits = torch.tensor([2.0, -1.0, 1.5, 0.5, 3.0])
    sampling = replace(
        ANSWER_SPEECH, temperature=0.5, top_p=0.5, top_k=1, repetition_penalty=2.0, min_kept=1
    )
    generator = torch.Generator().manual_seed(7)
    row = SpeechRow(logits.to(DEVICE), [0, 1, 0], sampling, generator)
    scores = unfiltered_scores([row]).cpu().numpy()
    expected = np.array([2.0 / 0.5 / 4.0, -1.0 / 0.5 * 2.0, 3.0, 1.0, 6.0], dtype=np.float32)
    assert np.array_equal(scores[0], expected)
    _, chosen = choose_chunk_speech_tokens([row])
    assert np.isfinite(chosen[0].cpu().numpy()).tolist() == [False, False, False, False, True]
    fresh = torch.Generator().manual_seed(7)
    draws = [torch.rand(1, generator=fresh) for _ in range(2)]
    assert torch.equal(torch.rand(1, generator=generator), draws[1])  # only the choice drew


def test_the_duplex_tables_layout_fits_the_simplex_window() -> None:
    """The two kernels share their launch and first steps, and so the
    table's layout: the penalty windows must be of one length."""
    assert SPEECH_PENALTY_WINDOW == DUPLEX_WINDOW
    row = SpeechRow(torch.zeros(8), [1, 2], ANSWER_SPEECH)
    assert len(table_row(row, 8)) == COLUMNS
