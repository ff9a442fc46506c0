"""The duplex unit's decisions (unit_rules.py) on hand-made logits: the model
code's decode rules, each case built so that only the rule under test decides."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnilive.engines.minicpmo.sessions.duplex.unit_rules import (
    DuplexVocab,
    TextChoice,
    UnitRules,
    choose_token,
    choose_tokens,
    kept_count,
)
from omnilive.engines.minicpmo.sessions.sampling import TextSampling

VOCAB = DuplexVocab(
    unit=10, unit_end=11, image_start=12, image_end=13, slice_start=14, slice_end=15,
    listen=16, speak=17, tts_bos=18, chunk_eos=19, chunk_tts_eos=20, turn_eos=21,
    tts_pad=22, decoder_listen=23, bad=(24,),
)  # fmt: skip
GREEDY = TextSampling(greedy=True)
SIZE = 32


def logits_with(**values: float) -> torch.Tensor:
    """Logits of -5 everywhere but at the named ``t<id>`` positions."""
    logits = torch.full((SIZE,), -5.0)
    for name, value in values.items():
        logits[int(name[1:])] = value
    return logits


def test_a_first_look_chunk_eos_ends_the_chunk_without_entering_the_history() -> None:
    history = [3]
    assert choose_token(logits_with(t19=4.0, t5=3.9), history, GREEDY, VOCAB) == VOCAB.chunk_eos
    assert history == [3]


def test_forbidden_tokens_are_never_chosen_after_the_first_look() -> None:
    history: list[int] = []
    logits = logits_with(t22=9.0, t24=8.0, t5=1.0)  # tts_pad, then a bad token
    assert choose_token(logits, history, GREEDY, VOCAB) == 5
    assert history == [5]


def test_the_repetition_penalty_damps_recent_tokens_whatever_their_sign() -> None:
    positive = logits_with(t5=2.0, t6=1.95)
    assert choose_token(positive, [], GREEDY, VOCAB) == 5
    assert choose_token(positive, [5], GREEDY, VOCAB) == 6  # 2.0 / 1.05 < 1.95
    # The model code divides negative logits too, which raises them.
    negative = logits_with(t5=-1.0, t6=-0.97)
    negative[7:] = -9.0
    negative[:5] = -9.0
    assert choose_token(negative, [], GREEDY, VOCAB) == 6
    assert choose_token(negative, [5], GREEDY, VOCAB) == 5  # -1.0 / 1.05 > -0.97
    # Only the window's last tokens count.
    windowed = TextSampling(greedy=True, repetition_window=2)
    assert choose_token(positive, [5, 8, 9], windowed, VOCAB) == 5


def test_the_length_penalty_holds_back_the_end_of_a_turn() -> None:
    logits = logits_with(t21=2.0, t5=1.95)
    assert choose_token(logits, [], GREEDY, VOCAB) == 5  # 2.0 / 1.1
    plain = TextSampling(greedy=True, length_penalty=1.0)
    assert choose_token(logits, [], plain, VOCAB) == VOCAB.turn_eos


def test_listen_prob_scale_scales_the_decoders_listen_token() -> None:
    logits = logits_with(t23=2.0, t5=1.5)
    assert choose_token(logits, [], GREEDY, VOCAB) == VOCAB.decoder_listen
    halved = TextSampling(greedy=True, listen_prob_scale=0.5)
    assert choose_token(logits, [], halved, VOCAB) == 5


def test_sampling_draws_from_the_sessions_generator_within_top_k() -> None:
    logits = logits_with(t1=3.0, t2=2.9, t3=2.8, t4=-1.0)
    sampling = TextSampling(top_k=2, top_p=1.0, temperature=1.0)
    draws = []
    for seed in (0, 0, 1):
        generator = torch.Generator().manual_seed(seed)
        draws.append([choose_token(logits, [], sampling, VOCAB, generator) for _ in range(20)])
    assert draws[0] == draws[1]  # the same seed, the same choices
    assert set(draws[0]) | set(draws[2]) <= {1, 2}


def test_choices_made_together_are_each_sessions_own() -> None:
    """Sessions' tokens chosen as one batch are what each chooses alone:
    greedy over its own history, sampled from its own generator."""
    generator = torch.Generator().manual_seed(7)
    rows = [torch.randn(SIZE, generator=generator) * 2 for _ in range(4)]
    for sampling in (GREEDY, TextSampling(top_k=5, top_p=0.9, temperature=0.8)):
        histories = [[1, 2], [5], [], [6, 7, 8]]
        alone = [list(history) for history in histories]
        together = [list(history) for history in histories]
        draws_alone, draws_together = [], []
        for _ in range(10):
            draws_alone.append([
                choose_token(row, history, sampling, VOCAB, torch.Generator().manual_seed(s))
                for s, (row, history) in enumerate(zip(rows, alone, strict=True))
            ])  # fmt: skip
            choices = [TextChoice(history, sampling, VOCAB, torch.Generator().manual_seed(s))
                       for s, history in enumerate(together)]  # fmt: skip
            draws_together.append(choose_tokens(list(zip(rows, choices, strict=True))))
        assert draws_together == draws_alone and together == alone


def test_a_sampled_first_look_follows_the_raw_distribution() -> None:
    """The first look draws from the unfiltered softmax: a chunk end as likely
    as the rest together ends about half the chunks."""
    logits = torch.full((SIZE,), -30.0)
    logits[VOCAB.chunk_eos], logits[5] = 1.0, 1.0
    sampling = TextSampling(top_k=20, top_p=1.0, temperature=1.0, repetition_penalty=1.0)
    generator = torch.Generator().manual_seed(3)
    ends = sum(
        choose_token(logits, [], sampling, VOCAB, generator) == VOCAB.chunk_eos for _ in range(400)
    )
    assert 150 < ends < 250


def test_top_k_keeps_every_token_tied_with_its_last_even_past_the_read_window() -> None:
    """Top-k keeps the tokens tied with its k-th (as the model code's filter
    does): 60 tied tokens with k=20 are all drawn, though a batched choice
    reads back only k + a margin of the best per row."""
    logits = torch.full((200,), -5.0)
    logits[100:160] = 2.0
    sampling = TextSampling(top_k=20, top_p=1.0, temperature=1.0, repetition_penalty=1.0,
                            length_penalty=1.0)  # fmt: skip
    generator = torch.Generator().manual_seed(11)
    drawn = {choose_token(logits, [], sampling, VOCAB, generator) for _ in range(600)}
    assert drawn == set(range(100, 160))


def test_top_p_keeps_the_token_that_crosses_it() -> None:
    ordered = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    assert kept_count(ordered, 0, 0.5) == 1
    assert kept_count(ordered, 0, 0.8) == 2
    assert kept_count(ordered, 3, 1.0) == 3 and kept_count(ordered, 0, 0.0) == 4


def full_sort_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The filter written out over the whole vocabulary (the model code's way)."""
    out = logits.clone()
    if top_k > 0:
        out[out < torch.topk(out, min(top_k, out.shape[-1])).values[-1]] = float("-inf")
    if top_p > 0.0:
        ordered, order = torch.sort(out, descending=True)
        over = torch.cumsum(torch.softmax(ordered, -1), -1) > top_p
        over[1:] = over[:-1].clone()
        over[0] = False
        out[order[over]] = float("-inf")
    return out


@pytest.mark.parametrize("top_k, top_p", [(20, 0.8), (0, 0.8), (5, 0.3), (50, 0.95), (20, 0.0)])
def test_the_kept_count_keeps_what_the_full_filter_keeps(top_k, top_p):
    generator = torch.Generator().manual_seed(top_k)
    for _ in range(20):
        logits = torch.randn(3000, generator=generator) * 3
        logits[torch.randint(3000, (40,), generator=generator)] = float("-inf")  # forbidden
        ordered = np.sort(logits.numpy())[::-1]
        kept = kept_count(ordered, top_k, top_p)
        assert kept == int(torch.isfinite(full_sort_top_k_top_p(logits, top_k, top_p)).sum())
        assert np.isfinite(ordered[:kept]).all()


def test_the_unified_codes_rules() -> None:
    assert UnitRules() == UnitRules(None, False, False)
    unified = UnitRules.unified()
    assert (unified.char_limit, unified.close_turn_on_forced_listen, unified.always_flush) == (
        28,
        True,
        True,
    )
    assert VOCAB.terminators == {VOCAB.listen, VOCAB.chunk_eos, VOCAB.chunk_tts_eos}
    assert VOCAB.forbidden == (VOCAB.tts_pad, 24, VOCAB.chunk_eos)
