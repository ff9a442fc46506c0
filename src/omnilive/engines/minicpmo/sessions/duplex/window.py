"""A slot session's sliding context on the GPU engine: the ledger's edits
(:mod:`omnilive.engines.context_window`, the model code's rules) made to the
session's slot of the batch loop's cache
(:mod:`~omnilive.engines.minicpmo.runtime.cache_edits`), in the model code's
order and numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from omnilive.engines.context_window import ContextLedger, Drop, Edit, Rewrite
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
    for run in _runs(edits):
        if isinstance(run, list):
            drop_positions(cache, slot, run[0].start, [drop.length for drop in run], theta)
            continue
        edit = run
        units = lift_positions(cache, slot, edit.units_start)
        cache.crop(slot, edit.prefix)
        if edit.tokens:
            yield Step(torch.tensor(edit.tokens))
        put_back(cache, slot, units, theta)


def _runs(edits: list[Edit]) -> list[list[Drop] | Rewrite]:
    """``edits`` with each run of drops at one start together (a basic
    window's units let go at once: one :func:`drop_positions` for all of
    them, the same bits as one each)."""
    runs: list[list[Drop] | Rewrite] = []
    for edit in edits:
        last = runs[-1] if runs else None
        if isinstance(edit, Drop) and isinstance(last, list) and last[0].start == edit.start:
            last.append(edit)
        else:
            runs.append([edit] if isinstance(edit, Drop) else edit)
    return runs


class SlidingContext:
    """One slot session's window, as its unit loop uses it: the ledger, the
    edits the last closed unit asked for, and that unit's closing tokens.

    The slot sessions feed a unit's closing tokens (its terminator and
    ``</unit>``) at the head of the next unit's forward; the model code
    feeds them when it closes the unit, before its window slides, so they
    attend to the units that then go. When edits are due, the closing
    tokens are fed alone first, then the edits are made, then the next
    unit's own forward runs: the same context, step for step, as the model
    code's. A unit's finalize slides its window at once (:meth:`slide`
    with its closing tokens: between units, while the client hears the
    unit, not at the head of the next unit's wait); edits that come up
    later (an appended note is a unit of its own) wait for the next unit's
    program, their closing tokens held back by :meth:`lead`."""

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

    def slide(self, cache: SlotCache, slot: int, closing: Sequence[int] = ()) -> Program[None]:
        """The edits due, after the closing tokens not fed yet (those
        :meth:`lead` held back, then ``closing``), as a program's steps. Both
        are taken when it is called, not when the program runs: a finalize
        calls it on the event loop, the next unit's program (on the batch
        loop's thread) for what is due then."""
        edits, self.edits = self.edits, []
        tokens, self._closing = [*self._closing, *closing], []
        return _slid(edits, tokens, cache, slot, self.rope_theta)


def _slid(
    edits: list[Edit], closing: list[int], cache: SlotCache, slot: int, theta: float
) -> Program[None]:
    if not edits:
        return
    if closing:
        yield Step(torch.tensor(closing))
    yield from make_edits(edits, cache, slot, theta)
