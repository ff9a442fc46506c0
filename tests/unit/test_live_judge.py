"""The Live session's cue judge (``worker/delegation/judge.py``, ``topics.py``): a
turn is delegated when it shares a content word, stemmed, with a tool or a
delegation line of the instructions, each widened by its topic's words."""

from __future__ import annotations

import pytest

from omnilive.worker.delegation.judge import CueJudge, Delegable, stem, words
from omnilive.worker.delegation.topics import sounds_like

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


CONCIERGE = Delegable(
    "You answer on the phone. Delegate to the backend: weather forecasts and flight status.",
    (
        {"type": "function", "name": "get_weather", "description": "The forecast for a city"},
        {"type": "function", "name": "flight_status", "description": "The status of a flight"},
    ),
)


@pytest.mark.parametrize(
    "turn",
    [
        "Do I need an umbrella in Berlin today?",
        "Is it snowing in Oslo?",
        "How cold is it going to get tonight?",
        "Will it be sunny on Saturday?",
        "Has the plane from Madrid landed?",
        "Is my departure from gate twelve delayed?",
        # Whisper's hearing of espeak-ng's "Will it rain in London this afternoon?"
        "We'll train in London this afternoon.",
    ],
)
def test_a_request_in_the_topic_s_own_words_is_delegated(turn: str):
    # None of these shares a word with the instructions or the tools: the
    # judge delegated none of them before cues were widened by their topic.
    verdict = CueJudge().judge_now(turn, CONCIERGE)
    assert verdict.delegate, verdict.why


@pytest.mark.parametrize(
    "turn",
    [
        "Whether or not you know it, tell me a story.",  # one letter from "weather"
        "What a shock that was!",  # one letter from "stock"
        "What should I cook for dinner?",
        "Tell me about the history of Rome.",
        "How do you say hello in Spanish?",
        "I had a great day at work.",
    ],
)
def test_a_request_for_the_model_itself_is_not_delegated(turn: str):
    verdict = CueJudge().judge_now(
        turn, Delegable(CONCIERGE.instructions, (*CONCIERGE.tools, STOCKS))
    )
    assert not verdict.delegate, verdict.why


def test_a_topic_joins_only_through_the_session_s_own_cues():
    # The stock session says nothing of the weather: rain is the model's to talk about.
    stocks_only = Delegable("Delegate share prices to the backend.", (STOCKS,))
    assert not CueJudge().judge_now("Will it rain tomorrow?", stocks_only).delegate
    assert CueJudge().judge_now("How is the market trading today?", stocks_only).delegate


@pytest.mark.parametrize(
    ("heard", "cue", "alike"),
    [
        ("train", "rain", True),
        ("rain", "rain", True),
        ("whether", "weather", False),
        ("shock", "stock", False),
        ("sun", "fun", False),
        ("hot", "shot", False),
        ("strain", "rain", False),
    ],
)
def test_sounds_like_is_a_letter_in_front_of_a_cue_of_four_letters_or_more(
    heard: str, cue: str, alike: bool
):
    assert sounds_like(heard, cue) is alike
