"""The sampling presets are the model code's own values, one type per token kind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from omnilive.engines.messages import GenerationOptions
from omnilive.engines.minicpmo.sessions.sampling import (
    ANSWER_SPEECH,
    ANSWER_TEXT,
    DUPLEX_SPEECH,
    DUPLEX_TEXT,
    answer_text,
)


def test_presets_are_the_model_codes_values() -> None:
    # MiniCPMODuplex's decode, and chunk_generate's / TTSSamplingParams' defaults.
    duplex = (DUPLEX_TEXT.temperature, DUPLEX_TEXT.top_k, DUPLEX_TEXT.top_p)
    assert duplex == (0.7, 20, 0.8)
    assert (DUPLEX_TEXT.repetition_penalty, DUPLEX_TEXT.length_penalty) == (1.05, 1.1)
    assert (ANSWER_TEXT.top_k, ANSWER_TEXT.repetition_penalty) == (100, 1.02)
    assert ANSWER_TEXT.length_penalty == 1.0
    assert (DUPLEX_SPEECH.temperature, DUPLEX_SPEECH.repetition_penalty) == (0.8, 1.05)
    assert not DUPLEX_SPEECH.warps
    assert (ANSWER_SPEECH.top_k, ANSWER_SPEECH.top_p, ANSWER_SPEECH.min_kept) == (25, 0.85, 3)
    assert ANSWER_SPEECH.warps


def test_an_answer_takes_the_requests_options_over_its_preset() -> None:
    options = GenerationOptions(do_sample=False, temperature=0.3, top_p=0.5, length_penalty=1.4)
    sampling = answer_text(options)
    assert (sampling.greedy, sampling.temperature, sampling.top_p) == (True, 0.3, 0.5)
    assert sampling.length_penalty == 1.4
    assert (sampling.top_k, sampling.repetition_penalty) == (100, 1.02)  # the preset's


def test_a_duplex_session_refuses_speech_warpers_it_cannot_apply() -> None:
    from omnilive.engines.minicpmo.sessions.duplex.session import SlotDuplex

    with pytest.raises(ValueError, match="top-k or top-p"):
        SlotDuplex(None, None, 0, speech=ANSWER_SPEECH)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top-k or top-p"):
        SlotDuplex(None, None, 0, speech=replace(DUPLEX_SPEECH, top_p=0.9))  # type: ignore[arg-type]
