"""What a recording put on the session's real timeline, read back from its
``recording.json``: where each piece of user and AI audio plays, when each
user frame was seen, and when each piece of AI text was said.

All times are milliseconds since the recording's ``start_ts``; a clip may
start before 0 (chat audio the user recorded before sending it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

USER = 0  # left channel
AI = 1  # right channel


@dataclass(frozen=True)
class Clip:
    """A WAV file (or a slice of one, in its own samples) placed at ``at_ms``."""

    channel: int
    at_ms: float
    file: str
    offset: int = 0  # first sample of the slice, at the file's rate
    length: int | None = None  # samples of the slice; None = to the end


@dataclass(frozen=True)
class Caption:
    start_ms: float
    end_ms: float
    text: str


@dataclass
class Timeline:
    clips: list[Clip] = field(default_factory=list)
    frames: list[tuple[float, str]] = field(default_factory=list)
    captions: list[Caption] = field(default_factory=list)
    end_ms: float = 0.0  # the session's end, if known


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) else default


def _duplex(doc: dict[str, Any], timeline: Timeline) -> None:
    for chunk in doc.get("chunks") or []:
        at = _num(chunk.get("receive_ts_ms"))
        if chunk.get("user_audio"):
            timeline.clips.append(Clip(USER, at, chunk["user_audio"]))
        frames = chunk.get("user_frames") or [chunk.get("user_frame")]
        frames = [frame for frame in frames if frame]
        timeline.frames.extend((at, frame) for frame in frames)
        result = chunk.get("result") or {}
        ai_at = _num(result.get("ai_audio_at_ms"), at)
        if result.get("ai_audio"):
            timeline.clips.append(Clip(AI, ai_at, result["ai_audio"]))
        text = (result.get("text") or "").strip()
        if text:
            shown_ms = max(_num(result.get("ai_audio_duration_ms")), 1000.0)
            timeline.captions.append(Caption(ai_at, ai_at + shown_ms, text))


def _turns(doc: dict[str, Any], timeline: Timeline) -> None:
    for turn in doc.get("turns") or []:
        source = turn.get("input") or {}
        if source.get("user_audio") and "user_audio_at_ms" in source:
            timeline.clips.append(
                Clip(USER, _num(source["user_audio_at_ms"]), source["user_audio"])
            )
        for message in source.get("messages") or []:
            for item in message.get("content") or []:
                if item.get("type") == "audio" and item.get("file") and "at_ms" in item:
                    timeline.clips.append(Clip(USER, _num(item["at_ms"]), item["file"]))
        output = turn.get("output") or {}
        if not output.get("audio"):
            continue
        offset = 0
        for segment in output.get("audio_segments") or []:
            length = int(segment.get("samples", 0))
            at = _num(segment.get("at_ms"))
            timeline.clips.append(Clip(AI, at, output["audio"], offset, length))
            offset += length
        segments = output.get("audio_segments") or []
        text = (output.get("text") or "").strip()
        if text and segments:
            start = _num(segments[0].get("at_ms"))
            end = start + max(_num(output.get("audio_duration_ms")), 1000.0)
            timeline.captions.append(Caption(start, end, text))


def timeline_of(doc: dict[str, Any]) -> Timeline:
    """The timeline of a duplex (``chunks``) or turn-based (``turns``) recording."""
    timeline = Timeline(end_ms=_num(doc.get("duration_ms")))
    if "chunks" in doc:
        _duplex(doc, timeline)
    else:
        _turns(doc, timeline)
    timeline.clips.sort(key=lambda c: c.at_ms)
    timeline.frames.sort(key=lambda f: f[0])
    timeline.captions.sort(key=lambda c: c.start_ms)
    return timeline
