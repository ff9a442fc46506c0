"""Replays of a finished (or abandoned) recording, built from what is on disk.

``merged_replay.wav``: stereo, left the user, right the AI, each clip at its
place on the session's real timeline (silence in between), 24 kHz. It is
mixed block by block, so a long session never sits in memory whole.

``merged_replay.mp4`` (sessions with user frames): the frames as a slideshow,
each shown from the moment it arrived, with that audio and the AI's text as a
subtitle track. ``subtitles.vtt`` holds the same text for the viewer page.
Soft subtitles rather than burned-in ones: no font or re-rendering needed,
and players can switch them off.

Everything here is blocking and meant for a writer or helper thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from omnilive.audio import AudioDecodeError, read_wav, resample
from omnilive.recording.files import (
    MERGED_MP4,
    MERGED_WAV,
    SUBTITLES,
    TEMP_SUFFIX,
    write_atomic,
)
from omnilive.recording.timeline import Caption, Clip, Timeline, timeline_of

log = logging.getLogger(__name__)

REPLAY_RATE = 24_000
BLOCK_SAMPLES = 30 * REPLAY_RATE  # mixed at a time: bounds memory on long sessions
VIDEO_FPS = 5
MAX_VIDEO_WIDTH = 1280
FFMPEG_MIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class _Placed:
    clip: Clip
    start: int  # first output sample
    length: int  # output samples
    rate: int  # the file's rate


def _probe(path: Path) -> tuple[int, int] | None:
    """(frames, rate) from a WAV header, without reading the samples."""
    try:
        with wave.open(str(path), "rb") as src:
            return src.getnframes(), src.getframerate()
    except (OSError, EOFError, wave.Error):
        return None


def _place(session_dir: Path, clips: list[Clip], origin_ms: float) -> list[_Placed]:
    placed = []
    for clip in clips:
        probed = _probe(session_dir / clip.file)
        if probed is None:
            log.warning("replay of %s: skipping unreadable %s", session_dir.name, clip.file)
            continue
        frames, rate = probed
        available = max(0, frames - clip.offset)
        length = available if clip.length is None else min(clip.length, available)
        start = round((clip.at_ms - origin_ms) * REPLAY_RATE / 1000)
        out_length = round(length * REPLAY_RATE / rate)
        if out_length:
            placed.append(_Placed(clip, start, out_length, rate))
    placed.sort(key=lambda p: p.start)
    return placed


class _Files:
    """Decoded WAV files, the latest one kept: a turn's answer is one file
    that many consecutive clips (its streamed chunks) are slices of."""

    def __init__(self, session_dir: Path) -> None:
        self.session_dir = session_dir
        self._last: tuple[str, np.ndarray, int] | None = None

    def read(self, name: str) -> tuple[np.ndarray, int]:
        if self._last is None or self._last[0] != name:
            samples, rate = read_wav((self.session_dir / name).read_bytes())
            self._last = (name, samples, rate)
        return self._last[1], self._last[2]


def _load(files: _Files, item: _Placed) -> np.ndarray:
    try:
        samples, rate = files.read(item.clip.file)
    except (OSError, AudioDecodeError):
        return np.zeros(item.length, np.float32)
    end = None if item.clip.length is None else item.clip.offset + item.clip.length
    piece = resample(samples[item.clip.offset : end], rate, REPLAY_RATE)
    if piece.size < item.length:  # rounding of the rate conversion
        piece = np.pad(piece, (0, item.length - piece.size))
    return piece[: item.length]


def _write_mix(session_dir: Path, placed: list[_Placed], total: int, out: wave.Wave_write) -> None:
    files = _Files(session_dir)
    active: list[tuple[_Placed, np.ndarray]] = []
    upcoming = iter(placed)
    following = next(upcoming, None)
    for block_start in range(0, total, BLOCK_SAMPLES):
        block_end = min(total, block_start + BLOCK_SAMPLES)
        while following is not None and following.start < block_end:
            active.append((following, _load(files, following)))
            following = next(upcoming, None)
        block = np.zeros((block_end - block_start, 2), np.float32)
        for item, samples in active:
            lo, hi = max(item.start, block_start), min(item.start + item.length, block_end)
            if lo < hi:
                block[lo - block_start : hi - block_start, item.clip.channel] += samples[
                    lo - item.start : hi - item.start
                ]
        active = [(i, s) for i, s in active if i.start + i.length > block_end]
        pcm = (np.clip(block, -1.0, 1.0) * 32767.0).astype("<i2")
        out.writeframes(pcm.tobytes())


@dataclass(frozen=True)
class Geometry:
    """Where the replay's time 0 is on the recording's clock, and its length."""

    origin_ms: float
    total_ms: float


def geometry_of(timeline: Timeline) -> Geometry:
    origin = min([0.0, *(c.at_ms for c in timeline.clips)])
    ends = [timeline.end_ms, *(at + 1000.0 for at, _ in timeline.frames)]
    return Geometry(origin, max(ends) - origin)


def build_wav(session_dir: Path, timeline: Timeline, geometry: Geometry) -> float | None:
    """``merged_replay.wav``; returns its length in ms, None when the session
    has no audio at all."""
    placed = _place(session_dir, timeline.clips, geometry.origin_ms)
    if not placed:
        return None
    total = max(
        round(geometry.total_ms * REPLAY_RATE / 1000), max(p.start + p.length for p in placed)
    )
    target = session_dir / MERGED_WAV
    temp = session_dir / f".{MERGED_WAV}{TEMP_SUFFIX}"
    try:
        with wave.open(str(temp), "wb") as out:
            out.setnchannels(2)
            out.setsampwidth(2)
            out.setframerate(REPLAY_RATE)
            _write_mix(session_dir, placed, total, out)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    return total * 1000 / REPLAY_RATE


def _timestamp(ms: float, separator: str) -> str:
    ms = max(0, round(ms))
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{millis:03d}"


def _cues(captions: list[Caption], origin_ms: float) -> list[tuple[float, float, str]]:
    """Captions on the replay's clock; each ends before the next begins."""
    cues = []
    for index, caption in enumerate(captions):
        end = caption.end_ms
        if index + 1 < len(captions):
            end = min(end, captions[index + 1].start_ms)
        if end > caption.start_ms:
            cues.append((caption.start_ms - origin_ms, end - origin_ms, caption.text))
    return cues


def subtitles(captions: list[Caption], origin_ms: float, kind: str) -> str:
    """The captions as ``srt`` or ``vtt`` text."""
    lines = ["WEBVTT", ""] if kind == "vtt" else []
    separator = "." if kind == "vtt" else ","
    for number, (start, end, text) in enumerate(_cues(captions, origin_ms), 1):
        if kind == "srt":
            lines.append(str(number))
        lines.append(f"{_timestamp(start, separator)} --> {_timestamp(end, separator)}")
        lines.extend([text.replace("\n", " ").replace("-->", "->"), ""])
    return "\n".join(lines)


def _video_size(first_frame: Path) -> tuple[int, int]:
    try:
        with Image.open(first_frame) as img:
            width, height = img.size
    except (OSError, UnidentifiedImageError):
        width, height = 640, 480
    if width > MAX_VIDEO_WIDTH:
        width, height = MAX_VIDEO_WIDTH, round(height * MAX_VIDEO_WIDTH / width)
    return max(2, width // 2 * 2), max(2, height // 2 * 2)


def _concat_list(frames: list[tuple[float, str]], geometry: Geometry) -> str:
    """An ffconcat slideshow: each frame from its arrival to the next one's;
    the first also covers the start, the last runs to the end."""
    lines = ["ffconcat version 1.0"]
    times = [at - geometry.origin_ms for at, _ in frames]
    times[0] = 0.0
    for index, (_, name) in enumerate(frames):
        end = times[index + 1] if index + 1 < len(frames) else geometry.total_ms
        lines += [f"file '{name}'", f"duration {max(end - times[index], 1.0) / 1000:.3f}"]
    lines.append(f"file '{frames[-1][1]}'")  # the demuxer drops the last duration otherwise
    return "\n".join(lines) + "\n"


def build_mp4(session_dir: Path, timeline: Timeline, geometry: Geometry) -> bool:
    """``merged_replay.mp4`` from the frames and ``merged_replay.wav``."""
    ffmpeg = shutil.which("ffmpeg")
    frames = [(at, name) for at, name in timeline.frames if (session_dir / name).is_file()]
    if ffmpeg is None:
        log.warning("ffmpeg not found: no video replay for %s", session_dir.name)
        return False
    if not frames or not (session_dir / MERGED_WAV).is_file():
        return False
    width, height = _video_size(session_dir / frames[0][1])
    concat = session_dir / f".frames.ffconcat{TEMP_SUFFIX}"
    srt = session_dir / f".subtitles.srt{TEMP_SUFFIX}"
    temp = session_dir / f".{MERGED_MP4}{TEMP_SUFFIX}"
    cues = subtitles(timeline.captions, geometry.origin_ms, "srt")
    command = [ffmpeg, "-nostdin", "-y", "-loglevel", "error",
               "-f", "concat", "-i", concat.name, "-i", MERGED_WAV]  # fmt: skip
    if cues:
        command += ["-i", srt.name]
    command += ["-map", "0:v", "-map", "1:a"] + (["-map", "2:s"] if cues else [])
    command += [
        "-vf",
        f"scale={width}:{height}:force_original_aspect_ratio=decrease,"
        f"pad={width}:{height}:(ow-iw)/2:(oh-ih)/2,setsar=1,fps={VIDEO_FPS},format=yuv420p",
        "-c:v", "libx264", "-preset", "veryfast", "-tune", "stillimage", "-crf", "28",
        "-c:a", "aac", "-b:a", "96k",
        *(["-c:s", "mov_text"] if cues else []),
        "-t", f"{geometry.total_ms / 1000:.3f}", "-movflags", "+faststart",
        "-f", "mp4", temp.name,
    ]  # fmt: skip
    timeout = max(FFMPEG_MIN_TIMEOUT_S, 2 * geometry.total_ms / 1000)
    try:
        concat.write_text(_concat_list(frames, geometry))
        if cues:
            srt.write_text(cues, encoding="utf-8")
        result = subprocess.run(
            command, cwd=session_dir, capture_output=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log.warning("ffmpeg failed for %s: %s", session_dir.name, result.stderr.decode()[-500:])
            return False
        os.replace(temp, session_dir / MERGED_MP4)
        return True
    except subprocess.TimeoutExpired:
        log.warning("ffmpeg took over %.0f s for %s; no video replay", timeout, session_dir.name)
        return False
    finally:
        for path in (concat, srt, temp):
            path.unlink(missing_ok=True)


def build_replays(session_dir: Path, doc: dict[str, Any]) -> list[str]:
    """Every replay the recording ``doc`` allows; returns the files written."""
    timeline = timeline_of(doc)
    geometry = geometry_of(timeline)
    built = []
    audio_ms = build_wav(session_dir, timeline, geometry)
    if audio_ms is not None:
        built.append(MERGED_WAV)
        geometry = Geometry(geometry.origin_ms, audio_ms)
    if timeline.captions:
        vtt = subtitles(timeline.captions, geometry.origin_ms, "vtt")
        write_atomic(session_dir / SUBTITLES, vtt.encode("utf-8"))
        built.append(SUBTITLES)
    if timeline.frames and build_mp4(session_dir, timeline, geometry):
        built.append(MERGED_MP4)
    return built
