"""The Live session's cue judge (``worker/delegation/judge.py``): a turn is
delegated when it shares a content word, stemmed, with a tool or a delegation
line of the instructions."""

from __future__ import annotations

import pytest

from omnilive.worker.delegation.judge import CueJudge, Delegable, stem, words

STOCKS = {"type": "function", "name": "stock_price", "description": "The price of a stock or share"}


@pytest.mark.parametrize(
    "forms",
    [
        ("share", "shares", "shared", "sharing"),
        ("price", "prices", "priced"),
        ("table", "tables"),
        ("city", "cities"),
        ("class", "classes"),
        ("book", "books", "booked", "booking"),
        ("box", "boxes"),
    ],
)
def test_a_words_forms_meet(forms: tuple[str, ...]):
    assert len({stem(form) for form in forms}) == 1, [stem(form) for form in forms]


def test_a_plural_in_the_turn_meets_the_tools_singular():
    # "shares" was stemmed "shar" and "share" kept whole: the Live benchmark's
    # "How are Tesla shares doing today?" went undelegated.
    delegable = Delegable("Answer anything yourself.", (STOCKS,))
    verdict = CueJudge().judge_now("How are Tesla shares doing today?", delegable)
    assert verdict.delegate, verdict.why


def test_function_words_and_a_turn_without_a_cue():
    assert words("What is the weather in Paris?") == {"weather", "pari"}
    delegable = Delegable("Delegate weather questions to the backend.", (STOCKS,))
    assert not CueJudge().judge_now("Tell me a joke about cats.", delegable).delegate
