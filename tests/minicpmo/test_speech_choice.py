"""The speech LM's token choice (speech_choice.py): the model code's rule on
hand-made logits, the rows of a batch chosen as each alone, and the batched
tensor restatement held to the rule written plainly over numpy."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from omnilive.engines.minicpmo.runtime import kernels
from omnilive.engines.minicpmo.sessions.duplex.speech_choice import (
    KernelChoice,
    SpeechPick,
    Uniforms,
    choose_fused,
    choose_rows,
    choose_speech_token,
    choose_speech_tokens,
    table_row,
)
from omnilive.engines.minicpmo.sessions.sampling import SpeechSampling

EOS = 299


def test_speech_eos_waits_for_the_chunks_minimum() -> None:
    logits = torch.tensor([0.0, 1.0, 3.0, 5.0])  # eos = 3 is the best
    greedy = SpeechSampling(temperature=0.0)
    assert choose_speech_token(logits, [], greedy, eos=3, allow_eos=False) == 2
    assert choose_speech_token(logits, [], greedy, eos=3, allow_eos=True) == 3


def test_speech_repetition_counts_each_occurrence_in_the_last_sixteen() -> None:
    logits = torch.tensor([2.0, 1.92, 1.7, -9.0])
    greedy = SpeechSampling(temperature=0.0, repetition_penalty=1.05)
    assert choose_speech_token(logits, [0], greedy, eos=3, allow_eos=False) == 1  # 1.905
    # Once each: 2.0 / 1.05 > 1.92 / 1.05; 0 twice: 2.0 / 1.05**2 = 1.814 < 1.829.
    assert choose_speech_token(logits, [0, 1], greedy, eos=3, allow_eos=False) == 0
    assert choose_speech_token(logits, [0, 0, 1], greedy, eos=3, allow_eos=False) == 1
    # Seventeen tokens back is out of the window.
    assert choose_speech_token(logits, [0] + [2] * 16, greedy, eos=3, allow_eos=False) == 0


def test_speech_tokens_are_drawn_from_the_softmax_by_the_sessions_generator() -> None:
    logits = torch.tensor([0.0, float(np.log(3.0)), -30.0, -30.0])  # 1 three times as likely
    plain = SpeechSampling(temperature=1.0, repetition_penalty=1.0)

    def draws(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return [choose_speech_token(logits, [], plain, 3, True, generator) for _ in range(400)]

    assert draws(5) == draws(5) and set(draws(5)) == {0, 1}
    assert 250 < draws(6).count(1) < 350


def plain_rule(logits: torch.Tensor, pick: SpeechPick) -> int:
    """The rule one row at a time over numpy (float32 to the draw, the draw's
    softmax and cumulative sum in float64): what the batched one restates."""
    scores = logits.float().numpy().copy()
    sampling = pick.sampling
    if sampling.temperature > 0:
        scores /= np.float32(sampling.temperature)
    penalty = np.float32(sampling.repetition_penalty)
    for token, count in Counter(pick.previous[-16:]).items():
        factor = penalty ** np.float32(count)
        scores[token] = scores[token] * factor if scores[token] < 0 else scores[token] / factor
    if not pick.allow_eos:
        scores[pick.eos] = -np.inf
    if sampling.temperature <= 0:
        return int(np.argmax(scores))
    shifted = np.exp(scores.astype(np.float64) - scores.max())
    cumulative = np.cumsum(shifted / shifted.sum())
    uniform = float(torch.rand(1, generator=pick.uniforms.generator)) * cumulative[-1]
    return min(int(np.searchsorted(cumulative, uniform, side="right")), len(scores) - 1)


def random_picks(seed: int, count: int) -> list[tuple[torch.Tensor, SpeechPick]]:
    """Rows of every kind: sampled at two temperatures and greedy, with and
    without repeated tokens, the end allowed or not; logits with ties."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(count):
        logits = (torch.randn(EOS + 1, generator=generator) * 2).to(torch.bfloat16)
        previous = torch.randint(0, 40, (k % 20,), generator=generator).tolist()
        sampling = SpeechSampling(temperature=(0.8, 0.0, 1.3)[k % 3], repetition_penalty=1.05)
        own = torch.Generator().manual_seed(seed * 100 + k)
        rows.append((logits, SpeechPick(previous, k % 4 != 0, EOS, sampling, Uniforms(own), [])))
    return rows


def test_the_batched_choice_is_the_rule_row_by_row() -> None:
    for seed in range(40):
        rows = random_picks(seed, 9)
        again = random_picks(seed, 9)  # the same generators, fresh
        expected = [plain_rule(logits, pick) for logits, pick in again]
        assert choose_speech_tokens(rows) == expected


def test_rows_chosen_together_are_chosen_as_each_alone() -> None:
    rows = random_picks(7, 12)
    alone = random_picks(7, 12)
    together = choose_speech_tokens(rows)
    assert together == [choose_speech_tokens([row])[0] for row in alone]
    for (_, pick), (_, single) in zip(rows, alone, strict=True):
        assert torch.equal(pick.seen[0], single.seen[0])  # type: ignore[index]


def test_rows_padded_for_a_graph_leave_the_real_rows_alone() -> None:
    rows = random_picks(3, 3)
    logits = torch.stack([row for row, _ in rows])
    table = torch.tensor([table_row(pick, EOS + 1) for _, pick in rows], dtype=torch.float64)
    tokens, scores = choose_rows(logits, table)
    padded = torch.cat([logits, logits[-1:].expand(5, -1)])
    padded_tokens, padded_scores = choose_rows(padded, torch.cat([table, table[-1:].expand(5, -1)]))
    assert padded_tokens[:3].tolist() == tokens.tolist()
    assert torch.equal(padded_scores[:3], scores)


def test_a_sessions_numbers_drawn_ahead_are_its_generators_one_by_one() -> None:
    ahead = Uniforms(torch.Generator().manual_seed(4), ahead=8)
    one_by_one = torch.Generator().manual_seed(4)
    assert [ahead.next() for _ in range(20)] == [
        float(torch.rand(1, generator=one_by_one)) for _ in range(20)
    ]


@pytest.mark.skipif(not kernels.AVAILABLE, reason="Triton is not installed")
def test_the_kernel_chooses_as_the_tensor_rule() -> None:
    """The CUDA path's one kernel (in Triton's interpreter here) against
    :func:`choose_rows`: the same scores bit for bit, the same tokens."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a real GPU's Triton, if any
    for seed in (1, 2):
        rows = random_picks(seed, 7)
        logits = torch.stack([row for row, _ in rows]).to(device)
        table = torch.tensor([table_row(pick, EOS + 1) for _, pick in rows], dtype=torch.float64)
        table = table.to(device)
        tokens, scores = choose_fused(logits, table)
        expected_tokens, expected_scores = choose_rows(logits, table)
        assert tokens.tolist() == expected_tokens.tolist()
        assert torch.equal(scores, expected_scores)


def test_a_kernel_that_fails_at_warm_up_leaves_its_tensor_rule(
    caplog: pytest.LogCaptureFixture,
) -> None:
    choice = KernelChoice("a kernel")
    choice.on = True  # as on a GPU with Triton
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    ran = []

    def choose() -> None:
        ran.append(choice.on)
        if choice.on:
            raise RuntimeError("does not compile")

    choice.warm(choose, cuda)
    assert ran == [True, False] and not choice.uses(cuda)
    assert "a kernel failed (does not compile)" in caplog.text
    with pytest.raises(ZeroDivisionError):  # the tensor rule's own failure is not hidden
        choice.warm(lambda: 1 / 0, torch.device("cpu"))


def test_a_kernel_that_compiles_stays() -> None:
    choice = KernelChoice("a kernel")
    choice.on = True
    choice.warm(lambda: None, torch.device("cuda"))
    assert choice.uses(torch.device("cuda")) and not choice.uses(torch.device("cpu"))
