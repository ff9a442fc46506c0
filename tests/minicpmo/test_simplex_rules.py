"""A simplex answer's choices (simplex_rules.py) against the model code's
procedure restated with torch and transformers' own warpers: penalties, top-k,
top-p and the draw's support, on hand-made and random logits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from omnilive.engines.minicpmo.sessions.sampling import ANSWER_SPEECH, ANSWER_TEXT, SpeechSampling
from omnilive.engines.minicpmo.sessions.simplex.rules import (
    AnswerRow,
    SimplexVocab,
    _divide,
    _divisor,
    choose_answer_token,
    choose_answer_tokens,
)
from omnilive.engines.minicpmo.sessions.simplex.speech_choice import (
    SpeechRow,
    choose_chunk_speech_token,
    choose_chunk_speech_tokens,
)

VOCAB = SimplexVocab(terminators=(30, 31), forbidden=(5, 6))
GREEDY = replace(ANSWER_TEXT, greedy=True)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
]


def test_greedy_takes_the_best_token_after_masking_the_forbidden() -> None:
    logits = torch.zeros(32)
    logits[5], logits[7] = 9.0, 3.0
    assert choose_answer_token(logits, [], GREEDY, VOCAB, suppress=True)[0] == 7
    assert choose_answer_token(logits, [], GREEDY, VOCAB, suppress=False)[0] == 5


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    sampling = replace(ANSWER_TEXT, greedy=True, repetition_penalty=2.0)
    logits = torch.full((32,), -10.0)
    logits[1], logits[2] = 4.0, 2.5  # 1 repeated: 4 / 2 = 2 < 2.5
    assert choose_answer_token(logits, [1, 1], sampling, VOCAB, suppress=True)[0] == 2
    logits[1], logits[2] = -1.0, -1.5  # 2 repeated: -1.5 * 2 = -3 < -1
    token, scores = choose_answer_token(logits, [2], sampling, VOCAB, suppress=True)
    assert token == 1 and scores[2] == pytest.approx(-3.0)


def test_the_length_penalty_damps_the_terminators() -> None:
    sampling = replace(ANSWER_TEXT, greedy=True, length_penalty=2.0)
    logits = torch.zeros(32)
    logits[30], logits[3] = 3.0, 2.0
    assert choose_answer_token(logits, [], sampling, VOCAB, suppress=True)[0] == 3
    assert choose_answer_token(logits, [], GREEDY, VOCAB, suppress=True)[0] == 30


def test_sampling_draws_only_what_top_k_and_top_p_keep() -> None:
    sampling = replace(ANSWER_TEXT, temperature=0.7, top_k=4, top_p=0.8, repetition_penalty=1.0)
    logits = torch.tensor([8.0, 7.5, 7.0, 6.9, 6.8] + [0.0] * 27)
    # The model code: temperature, top-k (4 kept), then the tokens whose
    # preceding cumulative probability is within top_p.
    scaled = logits / 0.7
    kept = torch.topk(scaled, 4).indices
    probs = torch.softmax(scaled[kept], -1)
    within = torch.cumsum(probs, -1) - probs <= 0.8
    allowed = set(kept[within].tolist())
    generator = torch.Generator().manual_seed(0)
    drawn = {
        choose_answer_token(logits, [], sampling, VOCAB, True, generator)[0] for _ in range(300)
    }
    assert drawn == allowed


def hf_speech_support(logits: torch.Tensor, previous: list[int], s: SpeechSampling) -> set:
    """What the model code's TTS sampling may draw: temperature, its
    repetition penalty over the last 16 tokens, then transformers' TopP and
    TopK warpers (min 3 kept)."""
    scores = logits[None].float() / s.temperature
    if previous:
        window = torch.tensor(previous[-16:])[None]
        freq = torch.nn.functional.one_hot(window, scores.shape[1]).sum(1)
        alpha = torch.pow(s.repetition_penalty, freq)
        scores = torch.where(scores < 0, scores * alpha, scores / alpha)
    ids = torch.zeros(1, 1, dtype=torch.long)
    scores = TopPLogitsWarper(s.top_p, min_tokens_to_keep=3)(ids, scores)
    scores = TopKLogitsWarper(s.top_k, min_tokens_to_keep=3)(ids, scores)
    return set(torch.nonzero(torch.isfinite(scores[0])).reshape(-1).tolist())


@pytest.mark.parametrize("seed", range(5))
def test_speech_choices_keep_what_the_warpers_keep(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sampling = replace(ANSWER_SPEECH, top_k=6, top_p=0.7, repetition_penalty=1.5)
    logits = torch.from_numpy(rng.normal(0, 2, 64).astype(np.float32))
    previous = [int(t) for t in rng.integers(0, 64, 20)]
    allowed = hf_speech_support(logits, previous, sampling)
    _, scores = choose_chunk_speech_token(logits, previous, sampling)
    assert set(np.flatnonzero(np.isfinite(scores)).tolist()) == allowed
    generator = torch.Generator().manual_seed(seed)
    drawn = {
        choose_chunk_speech_token(logits, previous, sampling, generator)[0] for _ in range(200)
    }
    assert drawn <= allowed and len(drawn) > 1


def test_a_turns_first_speech_token_is_not_penalized() -> None:
    sampling = replace(ANSWER_SPEECH, temperature=1e-6, repetition_penalty=10.0)
    logits = torch.zeros(16)
    logits[3], logits[4] = 2.0, 1.9
    assert choose_chunk_speech_token(logits, [], sampling)[0] == 3
    assert choose_chunk_speech_token(logits, [3], sampling)[0] == 4


# --- a tick's rows at once ----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_is_divided_as_torch_divides_by_a_python_number(device: str) -> None:
    """The batch divides each row by its own number as the per-row rule (and
    the model code) divide by a Python float: on CUDA torch multiplies by the
    float32 reciprocal, which can differ from a true division in the last bit."""
    scores = torch.randn(4, 4096, generator=torch.Generator().manual_seed(0)).to(device)
    by = [0.7, 1.02, 1.3, 0.3]
    divisors = [[_divisor(number, scores.is_cuda)] for number in by]
    rows = _divide(scores, torch.tensor(divisors, dtype=torch.float64, device=device))
    for k, number in enumerate(by):
        assert torch.equal(rows[k], scores[k] / number)


def _random_rows(seed: int, device: str) -> tuple[list[AnswerRow], list[SpeechRow]]:
    rng = np.random.default_rng(seed)
    answers, speech = [], []
    for k in range(6):
        logits = torch.from_numpy(rng.normal(0, 3, 300).astype(np.float32)).to(torch.bfloat16)
        sampling = replace(
            ANSWER_TEXT,
            greedy=k % 3 == 0,
            temperature=(0.7, 1.0, 0.3)[k % 3],
            top_k=(100, 5, 0)[k % 3],
            top_p=(0.8, 1.0)[k % 2],
            repetition_penalty=(1.02, 1.3, 1.0)[k % 3],
            length_penalty=(1.0, 1.5)[k % 2],
        )
        window = [int(t) for t in rng.integers(0, 300, 3 * k)]
        generator = torch.Generator().manual_seed(seed * 10 + k)
        answers.append(AnswerRow(logits.to(device), window, sampling, VOCAB, k % 2 == 0, generator))
        speech_sampling = replace(
            ANSWER_SPEECH,
            temperature=(0.8, 1e-6, 1.0)[k % 3],
            top_p=(0.85, 1.0)[k % 2],
            top_k=(25, 0, 3)[k % 3],
            repetition_penalty=(1.05, 1.5, 1.0)[k % 3],
            min_kept=(3, 1)[k % 2],
        )
        previous = [int(t) for t in rng.integers(0, 40, 4 * k)] or None
        generator = torch.Generator().manual_seed(seed * 10 + k + 5)
        speech.append(SpeechRow(logits.to(device), previous, speech_sampling, generator))
    return answers, speech


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(4))
def test_a_batch_chooses_what_each_row_would_alone(device: str, seed: int) -> None:
    """Rows of different windows, penalties, top-k, top-p and temperatures in
    one batch: each row's scores are bit for bit its own batch of one's, and
    its token the same (the same draw of its own generator)."""
    answers, speech = _random_rows(seed, device)
    tokens, scores = choose_answer_tokens(answers)
    alone_answers, _ = _random_rows(seed, device)  # fresh generators
    for k, row in enumerate(alone_answers):
        token, row_scores = choose_answer_token(*row)
        assert torch.equal(scores[k], row_scores)
        assert token == tokens[k]
    tokens, scores = choose_chunk_speech_tokens(speech)
    _, alone_speech = _random_rows(seed, device)
    for k, row in enumerate(alone_speech):
        token, row_scores = choose_chunk_speech_token(*row)
        assert np.array_equal(scores[k].cpu().numpy(), row_scores)
        assert token == tokens[k]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("seed", range(4))
def test_the_speech_rule_scores_on_cuda_as_on_the_cpu(seed: int) -> None:
    """The speech rule divides truly on both devices (tensor by tensor), so a
    row's kept scores, and with near-greedy temperatures its token, are the
    CPU's."""
    _, on_cpu = _random_rows(seed, "cpu")
    _, on_cuda = _random_rows(seed, "cuda")
    tokens, scores = choose_chunk_speech_tokens(on_cpu)
    cuda_tokens, cuda_scores = choose_chunk_speech_tokens(on_cuda)
    assert torch.equal(scores, cuda_scores.cpu())
    assert tokens == cuda_tokens
