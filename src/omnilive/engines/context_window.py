"""A sliding context's bookkeeping, without a tensor in sight: the rules of
MiniCPM-o's own duplex window (its ``StreamDecoder``: ``register_unit_end``,
``enforce_window``, ``enforce_window_with_context``), as the edits a session
makes to its context. The GPU engine makes them to its slot
(``minicpmo/sessions/duplex/window.py``); the scripted engine just counts.

The context is ``[system][unit][unit]...``; each unit spans ``<unit>`` to
``</unit>``, its terminator included. After a unit is closed:

- ``basic``: past ``high_tokens``, the oldest unit leaves (:class:`Drop`),
  again until the context is at most ``low_tokens``;
- ``context``: past ``max_units`` units, the oldest leaves, and the text
  tokens it spoke (special tokens left out) join a "previous" note kept
  between the system prompt's prefix and its suffix
  (``[prefix][marker + previous][suffix][units...]``), at most
  ``previous_max_tokens`` of it, the newest; the suffix and the note are
  written again after the prefix and the kept units follow (:class:`Rewrite`).
  A dropped unit that spoke nothing leaves the note as it was: its positions
  just go (:class:`Drop`).

The system prompt stays whatever happens. One decision is made per closed
unit, each edit in the model code's order (one unit at a time), so that an
engine can apply them exactly as the model code does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omnilive.engines.messages import ContextWindow, WindowMode


@dataclass(frozen=True)
class Drop:
    """Positions ``start .. start + length - 1`` leave; the rest move down."""

    start: int
    length: int


@dataclass(frozen=True)
class Rewrite:
    """Everything after ``prefix`` is written again: ``tokens`` (the note and
    the system prompt's suffix) fed after the prefix, then the kept units
    (``units_start`` to the end before the edit) moved to follow them."""

    prefix: int
    tokens: tuple[int, ...]
    units_start: int


Edit = Drop | Rewrite


@dataclass
class _Unit:
    length: int
    spoken: tuple[int, ...]  # the text tokens it said, specials left out (empty: listened)


@dataclass
class ContextLedger:
    """What one session's context holds and how its window slides.

    :meth:`system` after the system prompt is in; :meth:`unit_closed` after
    each unit's ``</unit>`` is counted (the edits to make come back, and
    :attr:`length` is the context's length once they are made)."""

    window: ContextWindow
    specials: frozenset[int]  # the tokens a note leaves out (the model code's list)
    marker: tuple[int, ...]  # the note's opening, "\n\nprevious: " tokenized
    length: int = 0
    prefix: int = 0  # the system prompt up to where the note goes
    suffix: tuple[int, ...] = ()  # the system prompt after the note
    previous: tuple[int, ...] = ()  # the note, its marker included (empty: none yet)
    units: list[_Unit] = field(default_factory=list)
    evicted_units: int = 0
    evictions: int = 0  # closed units that made the window slide
    _unit_start: int = 0

    @property
    def preserved(self) -> int:
        """The system prompt's positions, the note included: never dropped."""
        return self.prefix + len(self.previous) + len(self.suffix)

    def system(self, length: int, prefix: int | None = None, suffix: tuple[int, ...] = ()) -> None:
        """The system prompt is in: ``length`` positions, of which the first
        ``prefix`` come before where a note goes and ``suffix`` after it
        (only the ``context`` mode keeps a note; the others preserve it all)."""
        self.length = self._unit_start = length
        if self.window.mode is WindowMode.CONTEXT:
            self.suffix = tuple(suffix)
            self.prefix = length - len(self.suffix) if prefix is None else prefix
        else:
            self.prefix, self.suffix = length, ()

    def unit_closed(self, length: int, spoken: list[int], is_listen: bool) -> list[Edit]:
        """A unit ended at context length ``length``; the window's edits."""
        grown, self._unit_start = length - self._unit_start, length
        self.length = length
        if grown > 0:
            kept = () if is_listen else tuple(t for t in spoken if t not in self.specials)
            self.units.append(_Unit(grown, kept))
        if self.window.mode is WindowMode.BASIC:
            edits = self._basic()
        elif self.window.mode is WindowMode.CONTEXT:
            edits = self._context()
        else:
            edits = []
        self._unit_start = self.length
        if edits:
            self.evictions += 1
        return edits

    def _basic(self) -> list[Edit]:
        edits: list[Edit] = []
        if self.length <= self.window.high_tokens:
            return edits
        while self.length > self.window.low_tokens and self.units:
            unit = self.units.pop(0)
            edits.append(Drop(self.preserved, unit.length))
            self.length -= unit.length
            self.evicted_units += 1
        return edits

    def _context(self) -> list[Edit]:
        edits: list[Edit] = []
        while len(self.units) > self.window.max_units:
            unit = self.units.pop(0)
            self.evicted_units += 1
            if not unit.spoken:
                edits.append(Drop(self.preserved, unit.length))
                self.length -= unit.length
                continue
            kept = sum(u.length for u in self.units)
            units_start = self.length - kept
            note = (self.previous or self.marker) + unit.spoken
            excess = len(note) - len(self.marker) - self.window.previous_max_tokens
            if excess > 0:  # the note keeps its newest words
                note = self.marker + note[len(self.marker) + excess :]
            self.previous = tuple(note)
            edits.append(Rewrite(self.prefix, self.previous + self.suffix, units_start))
            self.length = self.preserved + kept
        return edits
