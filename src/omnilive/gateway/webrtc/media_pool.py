"""The gateway's media processes (``webrtc.media_processes``, ``docs/webrtc.md``).

Each runs aiortc for the calls it is given (``media_process.py``), so the
calls' media work spreads over the host's cores instead of the gateway's
one event loop. The gateway keeps the signalling: a call's offer goes to the
least-loaded process that is ready, over that process's channel
(``media_wire.py``), with a one-time pass for the caller; the process
answers it and opens the call's session as a WebSocket to the gateway's own
route, so the session path, queue, limits and recording are the WebSocket's.

A process that dies, or whose channel breaks, ends its calls: their
offers still waiting are refused (``503 media_process_lost``), its open calls
leave the registry (their sessions see a lost connection: held for a resume,
as a dropped WebSocket's are, and a page's new offer resumes them on another
process), one line says so, and the process is started again after a backoff
that doubles while it keeps dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from omnilive.gateway.supervisor import describe_exit, die_with_parent
from omnilive.gateway.webrtc import media_wire as wire
from omnilive.gateway.webrtc.calls import TooManyCalls
from omnilive.gateway.webrtc.media_process import CONFIG_ENV, READ_BYTES, MediaConfig
from omnilive.gateway.webrtc.media_wire import Answered, OpenCall, Refused
from omnilive.gateway.webrtc.offer import CallRefused
from omnilive.tasks import TaskSet

if TYPE_CHECKING:
    from omnilive.gateway.webrtc.calls import Calls

log = logging.getLogger(__name__)
READY_WAIT_S = 15.0  # an offer waits this long for a process to be ready (start-up, restart)
OPEN_TIMEOUT_S = 30.0  # answered (ICE gathered) and its session begun, or refused
STOP_GRACE_S = 5.0
STABLE_AFTER_S = 60.0
MAX_BACKOFF_S = 30.0
# Messages a process has not read yet; past it, it is stuck and is killed.
MAX_UNSENT_BYTES = 4 * 1024 * 1024


class ProcessState(StrEnum):
    STARTING = "starting"  # spawned, its Hello not yet heard
    READY = "ready"
    DOWN = "down"  # between lives, or stopped


class RemoteCall:
    """A call in the gateway's registry that a media process runs."""

    def __init__(self, call_id: str, process: MediaProcess) -> None:
        self.call_id = call_id
        self.process = process

    def close(self) -> None:
        self.process.send(wire.HangUp(self.call_id))


class MediaProcess:
    """One media process across its lives: started, watched, restarted."""

    def __init__(self, index: int, config: MediaConfig, pool: MediaPool) -> None:
        self.name = f"m{index}"
        self.config = config.model_copy(update={"name": self.name})
        self.pool = pool
        self.state = ProcessState.DOWN
        self.pid: int | None = None
        self.restarts = 0
        self.calls: set[str] = set()  # answered or being answered, not yet closed
        self._pending: dict[str, asyncio.Future[Answered | Refused]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = False

    @property
    def load(self) -> int:
        return len(self.calls)

    async def run(self) -> None:
        """Keep the process alive until the pool stops."""
        backoff = 0.5
        while not self._stopping:
            started = time.monotonic()
            code = await self._one_life()
            if self._stopping:
                return
            self.restarts += 1
            if time.monotonic() - started > STABLE_AFTER_S:
                backoff = 0.5
            log.error("media process %s (pid %s) ended with %s; restarting in %.1f s",
                      self.name, self.pid, describe_exit(code), backoff)  # fmt: skip
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _one_life(self) -> int:
        ours, theirs = socket.socketpair()
        env = {**os.environ, CONFIG_ENV: self.config.model_dump_json()}
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "omnilive.gateway.webrtc.media_process",
                "--channel-fd", str(theirs.fileno()),
                env=env, pass_fds=(theirs.fileno(),),
                start_new_session=True,  # a Ctrl-C reaches the gateway, which stops it
                preexec_fn=die_with_parent,
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._process, self.pid = process, process.pid
        self.state = ProcessState.STARTING
        log.info("media process %s started (pid %d)", self.name, process.pid)
        try:
            reader, self._writer = await asyncio.open_unix_connection(sock=ours)
            await self._read(reader)
        finally:
            self._end_life()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        return process.returncode if process.returncode is not None else -9

    async def _read(self, reader: asyncio.StreamReader) -> None:
        decoder = wire.Decoder()
        try:
            while data := await reader.read(READ_BYTES):
                for message in decoder.feed(data):
                    self._take(message)
        except wire.WireError as exc:
            log.error("media process %s sent what is no message (%s): stopping it", self.name, exc)
        except OSError as exc:
            log.error("media process %s: its channel failed: %r", self.name, exc)

    def _take(self, message: wire.Message) -> None:
        if isinstance(message, wire.Hello):
            self.state = ProcessState.READY
            log.info("media process %s (pid %d) takes calls", self.name, message.pid)
            self.pool.wake()
        elif isinstance(message, Answered | Refused):
            if isinstance(message, Refused):
                self._forget(message.call_id)
            waiting = self._pending.get(message.call_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(message)
        elif isinstance(message, wire.Closed):
            self._forget(message.call_id)
        else:
            log.warning("media process %s sent an unexpected %s", self.name, message.type)

    def _forget(self, call_id: str) -> None:
        self.calls.discard(call_id)
        self.pool.registry.discard(call_id)

    def _end_life(self) -> None:
        """The process is gone or going: its calls end, nothing of them is kept."""
        self.state = ProcessState.DOWN
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        lost = Refused("", 503, "media_process_lost", f"media process {self.name} ended")
        for call_id, waiting in self._pending.items():
            if not waiting.done():
                waiting.set_result(Refused(call_id, lost.status, lost.code, lost.message))
        ended = list(self.calls)
        for call_id in ended:
            self._forget(call_id)
        if ended and not self._stopping:
            log.error("media process %s (pid %s) is gone: its %d calls ended",
                      self.name, self.pid, len(ended))  # fmt: skip

    def send(self, message: wire.Message) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return  # between lives: its calls are ended already
        if writer.transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            log.error("media process %s stopped reading its channel: killing it", self.name)
            self.kill()
            return
        writer.write(wire.encode(message))

    async def open(self, opening: OpenCall) -> Answered | Refused:
        """Hand ``opening`` over and wait for its answer; a client that leaves
        (the route cancelled) hangs the call up."""
        waiting: asyncio.Future[Answered | Refused] = asyncio.get_running_loop().create_future()
        self._pending[opening.call_id] = waiting
        self.calls.add(opening.call_id)
        try:
            self.send(opening)
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                return await waiting
        except TimeoutError:
            self.send(wire.HangUp(opening.call_id))
            return Refused(opening.call_id, 503, "media_timeout",
                           f"media process {self.name} did not answer in time")  # fmt: skip
        except asyncio.CancelledError:
            self.send(wire.HangUp(opening.call_id))
            raise
        finally:
            del self._pending[opening.call_id]

    def kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()

    def stop(self) -> None:
        """Close the channel: the process ends its calls and exits."""
        self._stopping = True
        if self._writer is not None:
            self._writer.close()


class MediaPool:
    """K media processes and which calls each runs."""

    def __init__(self, config: MediaConfig, count: int) -> None:
        self.processes = [MediaProcess(index, config, self) for index in range(count)]
        self._registry: Calls | None = None
        self._ready = asyncio.Event()
        self._tasks = TaskSet("media")

    @property
    def registry(self) -> Calls:
        assert self._registry is not None, "the pool is not started"
        return self._registry

    def start(self, registry: Calls) -> None:
        """Start every process; calls they answer are counted in ``registry``."""
        self._registry = registry
        for process in self.processes:
            self._tasks.spawn(process.name, process.run())

    def wake(self) -> None:
        self._ready.set()

    async def _ready_process(self) -> MediaProcess:
        async with asyncio.timeout(READY_WAIT_S):
            while True:
                ready = [p for p in self.processes if p.state is ProcessState.READY]
                if ready:
                    return min(ready, key=lambda p: p.load)
                self._ready.clear()
                await self._ready.wait()

    async def open(self, opening: OpenCall, owner: str | None) -> str:
        """The SDP answer of ``opening``'s call, run by the least-loaded
        process, once its session began; or :class:`CallRefused`."""
        try:
            process = await self._ready_process()
        except TimeoutError:
            message = "no WebRTC media process is ready; use the WebSocket"
            raise CallRefused(503, "webrtc_unavailable", message) from None
        try:
            self.registry.add(RemoteCall(opening.call_id, process), owner)
        except TooManyCalls as exc:
            raise CallRefused(503, "too_many_peer_connections", str(exc)) from None
        try:
            reply = await process.open(opening)
        except BaseException:
            self.registry.discard(opening.call_id)
            raise
        if isinstance(reply, Refused):
            self.registry.discard(opening.call_id)
            raise CallRefused(reply.status, reply.code, reply.message)
        return reply.sdp

    def stats(self) -> dict[str, object]:
        return {
            "media_processes": len(self.processes),
            "media_ready": sum(p.state is ProcessState.READY for p in self.processes),
            "media_calls": [p.load for p in self.processes],
        }

    async def close(self) -> None:
        """Stop every process: each ends its calls and exits (or is killed
        after ``STOP_GRACE_S``)."""
        for process in self.processes:
            process.stop()
        await self._tasks.close()
