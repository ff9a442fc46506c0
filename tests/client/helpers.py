"""What the client's tests share: reading events of some kinds, and running
``omnilive talk`` as a user does."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import TypeVar

from omnilive.client import Event, Session
from tests.servers import REPO

E = TypeVar("E", bound=Event)


async def collect(session: Session, n: int, *kinds: type[E], timeout: float = 10) -> list[E]:
    """The next ``n`` events of ``kinds`` (others are read and passed over)."""
    found: list[E] = []
    while len(found) < n:
        event = await session.next_event(timeout=timeout)
        if isinstance(event, kinds):
            found.append(event)
    return found


TALK = [sys.executable, "-m", "omnilive", "talk"]


@dataclass
class Talked:
    code: int
    out: str
    err: str


def _as_from_a_terminal() -> None:
    """Ctrl-C's signal as a terminal's program has it. A test run started in
    the background of a script (``make test &``, CI's runners) ignores
    SIGINT, and a program started with it ignored keeps ignoring it: the
    pressed Ctrl-C would be lost and the conversation run to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def talk(*args: str, timeout: float = 60, interrupt_after: str | None = None) -> Talked:
    """Run ``omnilive talk``; with ``interrupt_after``, press Ctrl-C once that line shows."""
    process = await asyncio.create_subprocess_exec(
        *TALK,
        *args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_as_from_a_terminal,
    )
    assert process.stdout is not None
    lines: list[bytes] = []
    try:
        if interrupt_after is not None:
            async with asyncio.timeout(timeout):
                while interrupt_after.encode() not in (line := await process.stdout.readline()):
                    assert line, b"".join(lines).decode()
                    lines.append(line)
            lines.append(line)
            process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    assert process.returncode is not None
    return Talked(process.returncode, (b"".join(lines) + out).decode(), err.decode())
