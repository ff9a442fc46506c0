"""espeak-ng as a phonemizer that keeps running: text in, IPA clauses out.

Started afresh for every sentence, espeak-ng spends ~13 ms loading its
dictionaries before it phonemizes a few words in well under one, and a
sentence's audio waits for that. Given no text on its command line, espeak-ng
reads standard input line by line and flushes each line's phonemes (one line
per clause) as it goes, so one process serves every sentence: each request is
its text as one line followed by a marker line, and the reply is every line
up to the marker's phonemes, which were learnt when the process started.
espeak-ng stays a program of its own (no GPL code in the server's process).

Anything unexpected (the process gone, no marker within the timeout) stops the
process; that request and the next are phonemized by a one-shot espeak-ng,
and the next after that starts a new process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import threading
import time

from omnilive.engines.base import EngineError

log = logging.getLogger(__name__)

ESPEAK = "espeak-ng"
TIMEOUT_S = 10.0
MARKER = "omnilive marker line"
# espeak-ng reads a line into a buffer of 1,000 bytes and phonemizes longer
# lines in parts; such text goes to a one-shot process instead.
MAX_LINE_BYTES = 900


class Phonemizer:
    """IPA phonemes of text, one espeak-ng process per voice; thread-safe."""

    def __init__(self, voice: str) -> None:
        self.voice = voice
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._marker = ""  # the marker line's phonemes
        self._pending = b""  # read past the last complete line
        self._broken = False  # the last process failed: one request goes one-shot

    def clauses(self, text: str) -> list[str]:
        """The phonemes of each clause of ``text`` (empty ones left out)."""
        line = " ".join(text.split())
        encoded = line.encode("utf-8")
        if len(encoded) > MAX_LINE_BYTES or MARKER in line.lower():
            return once(self.voice, encoded)
        with self._lock:
            if self._broken:
                self._broken = False
                return once(self.voice, encoded)
            try:
                return self._ask(encoded)
            except (OSError, EngineError) as exc:
                log.warning("espeak-ng phonemizer restarts: %s", exc)
                self._stop()
                self._broken = True
        return once(self.voice, encoded)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ask(self, line: bytes) -> list[str]:
        if self._process is None:
            self._start()
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(line + b"\n" + MARKER.encode() + b"\n")
        self._process.stdin.flush()
        lines: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        while (got := self._line(deadline)) != self._marker:
            lines.append(got)
        return [clause for clause in lines if clause]

    def _start(self) -> None:
        try:
            self._process = subprocess.Popen(
                [ESPEAK, "-q", "--ipa", "-v", self.voice],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise EngineError(f"{ESPEAK} failed to start: {exc}") from exc
        self._pending = b""
        assert self._process.stdin is not None
        self._process.stdin.write(MARKER.encode() + b"\n")
        self._process.stdin.flush()
        self._marker = self._line(time.monotonic() + TIMEOUT_S)

    def _line(self, deadline: float) -> str:
        """The next line espeak-ng prints, or EngineError past ``deadline``."""
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stdout], [], [], left)[0]:
                raise EngineError(f"{ESPEAK} gave no phonemes within {TIMEOUT_S:.0f} s")
            data = os.read(stdout, 65536)
            if not data:
                raise EngineError(f"{ESPEAK} exited ({self._process.poll()})")
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode("utf-8", "replace").strip()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a dead process's stdin: a broken pipe
                    pipe.close()


def once(voice: str, text: bytes) -> list[str]:
    """The clauses' phonemes from an espeak-ng started for this text alone."""
    output = run_espeak(["-q", "--ipa", "-v", voice], text)
    lines = [line.strip() for line in output.decode("utf-8").splitlines()]
    return [line for line in lines if line]


def run_espeak(args: list[str], stdin: bytes) -> bytes:
    """What espeak-ng run once with ``args`` prints; EngineError if it fails."""
    try:
        done = subprocess.run(
            [ESPEAK, *args], input=stdin, capture_output=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"{ESPEAK} failed: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip()
        raise EngineError(f"{ESPEAK} failed ({done.returncode}): {detail}")
    return done.stdout
