"""Text written into a duplex session's context while the call runs (the
Live API's ``instructions``, ``thinking`` and ``commentary`` appends):
what a :meth:`~omnilive.engines.base.DuplexSession.append` is given, and how
an engine that writes it as a chat message words it.

- ``instructions``: more of the system's instructions, from now on;
- ``thinking``: silent context (a tool's progress, a result to keep in
  mind): the model may use it, it is not meant to be read out;
- ``commentary``: something to say to the user now (a delegation's result):
  the model relays it, in its own words where it has them.

The words are the same for every engine, so that a model's behaviour on
them is measured once (``benchmarks/live_dialect.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class NoteKind(StrEnum):
    INSTRUCTIONS = "instructions"
    THINKING = "thinking"
    COMMENTARY = "commentary"


@dataclass(frozen=True)
class ContextNote:
    kind: NoteKind
    text: str

    @property
    def speakable(self) -> bool:
        return self.kind is NoteKind.COMMENTARY


# How each kind reads as the system's message in a chat template: the model
# was trained on system turns, and the words tell it what the turn is for.
_LEADS = {
    NoteKind.INSTRUCTIONS: "",
    NoteKind.THINKING: "Context for you; do not read it out: ",
    NoteKind.COMMENTARY: "Tell the user this now, briefly, in your own words: ",
}


def system_text(note: ContextNote) -> str:
    """The note as the content of a system message."""
    return _LEADS[note.kind] + note.text.strip()
