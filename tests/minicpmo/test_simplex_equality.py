"""Batched chat and half-duplex conversations against the model's own simplex
code, on the CPU with a tiny random checkpoint of the same architecture
(benchmarks/simplex_equality.py). Skipped where the model code is not at hand
(see ``model_code.py``); the GPU run is in benchmarks/results/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code


@pytest.mark.parametrize("flavour", ["standalone", "unified"])
def test_batched_conversations_answer_as_the_model_code_alone(
    tiny_checkpoint: Path, flavour: str
) -> None:
    from benchmarks.simplex_equality import check

    report = check(tiny_checkpoint, flavour, 4, 3, max_new_tokens=24, endings=True)
    assert report["mismatches"] == []
    assert report["turns_compared"] == 12
    assert report["spoken_turns"] > 0  # the speech LM was held to it too
    assert report["finished_turns"] > 0  # answers that ended on a terminator
    assert report["speech_tokens"] > 0
    assert report["speech_ends"] > 0  # speech chunks that ended on the speech LM's end
    assert report["max_logit_difference"] < 1e-3
    assert max(report["batch_sizes"]) > 1  # the conversations shared forwards
    assert max(report["speech_batch_sizes"]) > 1


def test_the_near_tie_follower_leaves_equal_choices_alone(tiny_checkpoint: Path) -> None:
    """The GPU runs' follower (``--tie``) on, reading every speech pick's
    scores before top-p and top-k: in float32 on the CPU the batch rounds as
    each alone, so there is no near-tie to follow and nothing changes."""
    from benchmarks.simplex_equality import check

    report = check(tiny_checkpoint, "standalone", 2, 2, max_new_tokens=16, tie=0.5)
    assert report["mismatches"] == []
    assert report["speech_tokens"] > 0
    assert report["followed_ties"] == []
