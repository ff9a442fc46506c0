"""Text written into a MiniCPM-o duplex context between two units (the
Live API's appends): as the model's chat template writes a system turn,
``<|im_start|>system\\n{text}<|im_end|>\\n``, the turn the duplex context
itself opens with. The model code's path
(:func:`~omnilive.engines.minicpmo.reference.duplex.feed_between_units`) and
the slot sessions (:meth:`~omnilive.engines.minicpmo.sessions.duplex.session.SlotDuplex.append`)
write the same tokens at the same place: after one unit's ``</unit>``,
before the next ``<unit>``, a unit of its own for the sliding window (one
that said nothing: it leaves no words in a ``context`` window's note)."""

from __future__ import annotations

from typing import Any

from omnilive.engines.appends import ContextNote, system_text


def note_text(tokenizer: Any, note: ContextNote) -> str:
    """The note as the chat template renders a system message."""
    message = [{"role": "system", "content": system_text(note)}]
    if getattr(tokenizer, "chat_template", None):
        text: str = tokenizer.apply_chat_template(message, tokenize=False)
        return text
    return f"<|im_start|>system\n{system_text(note)}<|im_end|>\n"


def note_ids(tokenizer: Any, note: ContextNote) -> list[int]:
    ids: list[int] = tokenizer.encode(note_text(tokenizer, note), add_special_tokens=False)
    return ids
