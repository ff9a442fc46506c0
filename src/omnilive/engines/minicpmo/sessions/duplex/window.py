"""A slot session's sliding context on the GPU engine: the ledger's edits
(:mod:`omnilive.engines.context_window`, the model code's rules) made to the
session's slot of the batch loop's cache
(:mod:`~omnilive.engines.minicpmo.runtime.cache_edits`), in the model code's
order and numbers."""

from __future__ import annotations

from typing import Any

import torch

from omnilive.engines.context_window import ContextLedger, Drop, Edit
from omnilive.engines.messages import ContextWindow
from omnilive.engines.minicpmo.runtime.batch import SlotCache
from omnilive.engines.minicpmo.runtime.cache_edits import drop_positions, lift_positions, put_back
from omnilive.engines.minicpmo.runtime.programs import Program, Step

# --- the edits, made on the batch loop's thread ---------------------------------------

# The note's opening and the tokens it leaves out, as the model code's
# StreamDecoder has them (besides the tokenizer's own special tokens).
NOTE_MARKER = "\n\nprevious: "
_UNIT_TOKENS = (
    "<unit>",
    "</unit>",
    "<image>",
    "</image>",
    "<slice>",
    "</slice>",
    "<|listen|>",
    "<|speak|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|chunk_eos|>",
    "<|chunk_tts_eos|>",
    "<|turn_eos|>",
)


def ledger_for(window: ContextWindow, tokenizer: Any) -> ContextLedger:
    """A ledger with the model's marker and special tokens."""
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    unknown = getattr(tokenizer, "unk_token_id", None)
    for token in _UNIT_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is not None and token_id != unknown:
            specials.add(int(token_id))
    marker = tuple(tokenizer.encode(NOTE_MARKER, add_special_tokens=False))
    return ContextLedger(window, frozenset(specials), marker)


def make_edits(edits: list[Edit], cache: SlotCache, slot: int, theta: float) -> Program[None]:
    """``edits`` to ``slot``'s context, in order, within a program (a
    :class:`Rewrite` feeds its tokens as a step of the batch)."""
    for edit in edits:
        if isinstance(edit, Drop):
            drop_positions(cache, slot, edit.start, edit.length, theta)
            continue
        units = lift_positions(cache, slot, edit.units_start)
        cache.crop(slot, edit.prefix)
        if edit.tokens:
            yield Step(torch.tensor(edit.tokens))
        put_back(cache, slot, units, theta)


class SlidingContext:
    """One slot session's window, as its unit loop uses it: the ledger, the
    edits the last closed unit asked for, and that unit's closing tokens.

    The slot sessions feed a unit's closing tokens (its terminator and
    ``</unit>``) at the head of the next unit's forward; the model code
    feeds them when it closes the unit, before its window slides, so they
    attend to the units that then go. When edits are due, the closing
    tokens are fed alone first (:meth:`lead`, :meth:`slide`), then the edits
    are made, then the unit's own forward runs: the same context, step for
    step, as the model code's."""

    def __init__(self, window: ContextWindow, tokenizer: Any, rope_theta: float) -> None:
        self.ledger = ledger_for(window, tokenizer)
        self.rope_theta = rope_theta
        self.edits: list[Edit] = []
        self._closing: list[int] = []

    def closed(self, length: int, spoken: list[int], listened: bool) -> int:
        """A unit is closed at ``length``; the context's length after the window."""
        self.edits += self.ledger.unit_closed(length, spoken, listened)
        return self.ledger.length

    def lead(self, closing: list[int]) -> list[int]:
        """The closing tokens to lead the next unit's forward (none while edits
        are due: :meth:`slide` feeds them alone)."""
        if not self.edits:
            return closing
        self._closing += closing
        return []

    def slide(self, cache: SlotCache, slot: int) -> Program[None]:
        """Within the next unit's program, before its forward."""
        if not self.edits:
            return
        if self._closing:
            yield Step(torch.tensor(self._closing))
        edits, self.edits, self._closing = self.edits, [], []
        yield from make_edits(edits, cache, slot, self.rope_theta)
