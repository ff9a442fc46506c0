"""The duplex equality harness's comparison (benchmarks/duplex_equality.py):
the model code's traces against the batched engine's, unit by unit, with
near-ties told from differences."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.duplex_equality import UnitTrace


def first_difference(a: list[int], b: list[int]) -> int:
    """The first index where the two lists differ (a length if one is a prefix)."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return min(len(a), len(b))


def choice_gap(choices: list[Any], k: int, ours: list[int], theirs: list[int]) -> float | None:
    """How far apart the two tokens of differing choice ``k`` were in the
    logits the batched engine chose from (None: no such choice recorded)."""
    if k >= len(choices) or k >= len(ours) or k >= len(theirs):
        return None
    logits = choices[k]
    return abs(float(logits[ours[k]]) - float(logits[theirs[k]]))


def compare(
    reference: list[list[UnitTrace]], batched: list[list[UnitTrace]], tie: float = 1e-4
) -> dict[str, Any]:
    """Per session and unit: equal decisions, speech and context, and the
    largest logit difference.

    Two tokens whose logits are within ``tie`` of each other (float rounding:
    the batched forwards add the same numbers in another order) may be chosen
    either way; such a *tie* is counted, not failed. After a text tie the
    session's contexts differ, so its comparison ends there; after a speech
    tie, its speech is no longer compared (the LLM never hears speech tokens,
    so its decisions still are). Any other difference is a mismatch."""
    mismatches: list[dict[str, Any]] = []
    ties: list[dict[str, Any]] = []
    largest = 0.0
    compared = speak_units = 0
    for s, (ref_units, our_units) in enumerate(zip(reference, batched, strict=True)):
        speech_diverged = False
        for u, (ref, ours) in enumerate(zip(ref_units, our_units, strict=True)):
            # Logits while the contexts are the same: up to and including the
            # first different choice of the unit, if any.
            k = first_difference(ours.decided, ref.decided)
            for a, b in list(zip(ref.logits, ours.logits, strict=False))[: k + 1]:
                largest = max(largest, float((a - b).abs().max()))
            if ref.decided != ours.decided:
                gap = choice_gap(ours.text_choices, k, ours.decided, ref.decided)
                _file(ties, mismatches, tie, (s, u, k), gap, "text", (ref.decided, ours.decided))
                break  # the contexts differ from here on
            compared += 1
            speak_units += not ref.is_listen
            if not speech_diverged and ref.speech != ours.speech:
                k = first_difference(ours.speech, ref.speech)
                gap = choice_gap(ours.speech_choices, k, ours.speech, ref.speech)
                if not _file(
                    ties, mismatches, tie, (s, u, k), gap, "speech", (ref.speech, ours.speech)
                ):
                    break
                speech_diverged = True
            if (ref.is_listen, ref.kv_length) != (ours.is_listen, ours.kv_length):
                mismatches.append(
                    {
                        "session": s,
                        "unit": u,
                        "is_listen": (ref.is_listen, ours.is_listen),
                        "kv_length": (ref.kv_length, ours.kv_length),
                    }
                )
                break
    return {
        "sessions": len(reference),
        "units": sum(len(units) for units in reference),
        "units_compared": compared,
        "speak_units": speak_units,
        "ties": ties,
        "mismatches": mismatches,
        "max_logit_difference": largest,
        "equal": not mismatches,
    }


def _file(
    ties: list[dict[str, Any]],
    mismatches: list[dict[str, Any]],
    tie: float,
    where: tuple[int, int, int],
    gap: float | None,
    kind: str,
    tokens: tuple[list[int], list[int]],
) -> bool:
    """Files a differing choice (session, unit, index) of ``kind`` (text or
    speech) as a tie, within ``tie`` of the other token, or as a mismatch
    with both token lists; whether it was a tie."""
    session, unit, index = where
    if gap is not None and gap <= tie:
        ties.append({"session": session, "unit": unit, "kind": kind, "index": index})
        return True
    key = "decided" if kind == "text" else "speech"
    mismatches.append({"session": session, "unit": unit, "index": index, "gap": gap, key: tokens})
    return False
