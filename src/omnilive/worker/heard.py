"""What the user heard of an answer: the text of the audio they played.

A client reports how many milliseconds of an answer it played (half-duplex
``playback``; the Realtime GA dialect's ``conversation.item.truncate``).
Text spoken after that point was never heard: the model's context should not
hold it (docs/resume.md, *History = what was heard*).
"""

from __future__ import annotations

from dataclasses import dataclass, field

OUTPUT_RATE = 24_000


@dataclass
class SpokenAnswer:
    """One answer as it was streamed: each chunk's text and its audio length."""

    turn_index: int
    chunks: list[tuple[str, float]] = field(default_factory=list)  # (text, audio ms)

    def add(self, text: str, audio_samples: int) -> None:
        self.chunks.append((text, audio_samples / OUTPUT_RATE * 1000))

    @property
    def audio_ms(self) -> float:
        return sum(ms for _, ms in self.chunks)

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.chunks)


def heard_text(chunks: list[tuple[str, float]], played_ms: float) -> str:
    """The text of the first ``played_ms`` of the answer's audio. A chunk
    played in part keeps the share of its words that was played; a chunk with
    no audio (speech off) goes with the audio before it."""
    kept: list[str] = []
    at = 0.0
    for text, ms in chunks:
        if at + ms <= played_ms:
            kept.append(text)
            at += ms
            continue
        if at >= played_ms:
            break
        words = text.split()
        share = (played_ms - at) / ms
        kept.append(" ".join(words[: int(len(words) * share)]))
        break
    return "".join(kept).rstrip()
