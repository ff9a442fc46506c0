"""A session over one WebSocket: the socket, its reader task, its events.

Every mode's client is a :class:`Session` with its own rules
(``machine.ModeRules``) and messages. The reader task, owned by the session
and awaited when it closes, feeds each server message to the machine and
carries out what it answers; the user reads events (``async for``), waits
for readiness (``ready()``, or ``async with``), sends, and ends the session
the protocol's way (``stop()``; ``async with`` does it on the way out, so
Ctrl-C or an error in the caller still tells the server). A session that
failed raises the exception of its error code from ``ready()``, ``stop()``
and the end of its events.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import json
import ssl as ssl_module
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self, TypedDict, TypeVar, Unpack

import numpy as np
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from omnilive.client.audio import encode_pcm
from omnilive.client.buffer import DEFAULT_CAPACITY, EventBuffer
from omnilive.client.connection import DEFAULT_URL, Credentials, open_socket, with_query
from omnilive.client.errors import (
    ConnectionFailedError,
    OmniliveError,
    ProtocolViolationError,
    SessionClosedError,
)
from omnilive.client.events import Event, Prepared, SessionTimeout, Stopped
from omnilive.client.machine import (
    Action,
    ClientMachine,
    CloseSocket,
    Deliver,
    ModeRules,
    QueueStatus,
    Ready,
    Send,
    SessionState,
)

E = TypeVar("E", bound=Event)
STOP_TIMEOUT_S = 10.0
# Resuming after a dropped connection (docs/resume.md): the first retry, and
# the longest wait between two; retries stop at the server's grace period.
RESUME_FIRST_RETRY_S = 0.2
RESUME_MAX_RETRY_S = 4.0
ABNORMAL_CLOSE = 1006  # no close frame: the network dropped, nobody ended the session


def build(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """A client message checked by the server's own protocol model: the fields
    given (None: left out), validated, in their wire form."""
    given = {
        name: value.model_dump(mode="json", exclude_unset=True)
        if isinstance(value, BaseModel)
        else value
        for name, value in fields.items()
        if value is not None
    }
    return model.model_validate(given).model_dump(mode="json", exclude_unset=True)


Voice = np.ndarray | bytes | str | None
"""A reference voice: 16 kHz float32 samples, a WAV file's bytes, or the id
of a stored voice (``POST /api/assets/ref_audio``)."""


def voice_b64(voice: np.ndarray | bytes | None) -> str | None:
    """A voice's audio for the wire: 16 kHz float32 samples, or a WAV file's bytes."""
    if voice is None:
        return None
    if isinstance(voice, bytes | bytearray):
        return base64.b64encode(bytes(voice)).decode("ascii")
    return encode_pcm(voice)


def voice_fields(voice: Voice, audio_field: str, id_field: str) -> dict[str, str]:
    """A voice as its protocol's field: the audio, or the stored voice's id."""
    if voice is None:
        return {}
    if isinstance(voice, str):
        return {id_field: voice}
    return {audio_field: voice_b64(voice) or ""}


def frames_b64(frames: Sequence[bytes]) -> list[str] | None:
    """Camera frames (JPEG bytes) for the wire; None for none."""
    return [base64.b64encode(frame).decode("ascii") for frame in frames] or None


class ConnectOptions(TypedDict, total=False):
    """How a client reaches its server: keyword arguments of every mode's class."""

    key: str | None  # an API key, sent as Authorization: Bearer
    token: str | None  # a client token (``client_token()``), instead of a key
    ssl: ssl_module.SSLContext | None  # wss:// with a certificate authority of your own
    buffer: int  # events held for the reader (``buffer.py``)


class InputHints(TypedDict, total=False):
    """What may go with a piece of duplex input (``send(audio, frames, **hints)``)."""

    force_listen: bool  # the model must listen: it stops speaking
    max_slice_nums: int | None  # how finely the frames are cut (1-9; more is slower)


def check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(ConnectOptions.__annotations__))
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(unknown)}")


class Session(abc.ABC):
    """One long-lived session; see the module docstring."""

    def __init__(self, url: str = DEFAULT_URL, **options: Unpack[ConnectOptions]) -> None:
        check_options(options)
        self.url = url
        self.credentials = Credentials(key=options.get("key"), token=options.get("token"))
        self._ssl = options.get("ssl")
        self._buffer = EventBuffer(options.get("buffer", DEFAULT_CAPACITY))
        self.machine = ClientMachine(self._rules(), None)
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # ready, or ended before it
        self._closed = asyncio.Event()
        self._ready_event: Event | None = None
        # Resume: the server's token, its grace period, the last event received.
        self._resume_token: str | None = None
        self._resume_grace_s = 0.0
        self._last_seq = 0
        self._resuming = False
        self.resumes = 0  # connections resumed after a drop
        self.input_dropped = 0  # messages sent while the connection was down (lost)

    # --- what a mode defines ------------------------------------------------------------

    @abc.abstractmethod
    def _rules(self) -> ModeRules: ...

    @abc.abstractmethod
    def _configure_message(self) -> Mapping[str, Any] | None:
        """What configures the session (sent on queue_done, or at once for chat)."""

    @abc.abstractmethod
    def _socket_url(self) -> str: ...

    def _observe(self, event: Event) -> None:
        """Each event as it arrives, before the user reads it (a mode's own bookkeeping)."""
        return None

    # --- state ------------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self.machine.state

    @property
    def queue(self) -> QueueStatus:
        """Where the session stands in the server's queue (position, ETA)."""
        return self.machine.queue

    @property
    def dropped_events(self) -> int:
        """Events dropped because they were not read in time (see ``buffer.py``)."""
        return self._buffer.dropped

    @property
    def ending(self) -> Event | None:
        """The event that ended the session (``Stopped``, ``SessionClosed``, ...), if any."""
        return self.machine.ending

    # --- opening --------------------------------------------------------------------------

    async def open(self) -> Self:
        """Connect (refusals raise their typed exception) and start reading."""
        if self._ws is not None:
            raise SessionClosedError("a session is opened once")
        self.machine.configure = self._configure_message()
        url = with_query(self._socket_url(), seq="1")  # numbered events: resumable
        self._ws = await open_socket(url, self.credentials, self._ssl)
        opening = self.machine.opened()  # before the reader sees the server's first word
        self._reader = asyncio.create_task(self._read(self._ws), name=f"{self._name()}:reader")
        await self._apply(opening)
        return self

    async def ready(self, timeout: float | None = None) -> Event:
        """The event that made the session ready (``Prepared``, ``SessionCreated``),
        once the queue and configuration are behind it; raises how it failed."""
        async with asyncio.timeout(timeout):
            await self._settled.wait()
        if self._ready_event is not None:
            return self._ready_event
        if self.machine.outcome is not None:
            raise self.machine.outcome
        ended = type(self.machine.ending).__name__ if self.machine.ending else "the socket closed"
        raise SessionClosedError(f"the session ended before it was ready ({ended})")

    async def __aenter__(self) -> Self:
        await self.open()
        try:
            await self.ready()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- events -----------------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        return await self._buffer.get()

    async def next_event(self, timeout: float | None = None) -> Event:
        """The next event; raises the session's failure, or ``SessionClosedError`` at its end."""
        try:
            async with asyncio.timeout(timeout):
                return await self._buffer.get()
        except StopAsyncIteration:
            raise SessionClosedError("the session has ended") from None

    async def wait_for(self, *kinds: type[E], timeout: float | None = None) -> E:
        """Read events until one of ``kinds`` (the others are consumed and dropped)."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.next_event()
                if isinstance(event, kinds):
                    return event

    # --- sending and ending -------------------------------------------------------------

    async def _send(self, message: Mapping[str, Any]) -> None:
        """Send a data or control message of an active session."""
        self.machine.check_sendable()
        assert self._ws is not None
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            if self._resuming or self._ws.close_code in (None, ABNORMAL_CLOSE):
                self.input_dropped += 1  # sent into a dead socket: lost, as the server says
                return
            raise self.machine.outcome or SessionClosedError("the session has ended") from None

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> Event | None:
        """End the session the protocol's way and wait until the server has closed
        it. Returns the event that ended it; raises how it failed."""
        if self._ws is None:
            raise SessionClosedError("the session was never opened")
        await self._apply(self.machine.stop())
        try:
            async with asyncio.timeout(timeout):
                await self._closed.wait()
        except TimeoutError:
            await self._apply([CloseSocket()])  # the server is not answering: leave
            await self._closed.wait()
        if self.machine.outcome is not None:
            raise self.machine.outcome
        return self.machine.ending

    async def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop if still running, and wait for the socket and the reader to end.
        Never raises the session's outcome (``ready()`` and the events do)."""
        if self._ws is None or self._reader is None:
            return
        with contextlib.suppress(OmniliveError):
            await self.stop(timeout)
        await self._reader
        if self._closer is not None:
            await self._closer

    # --- the reader ---------------------------------------------------------------------------

    def _name(self) -> str:
        return f"omnilive.client.{type(self).__name__}"

    async def _read(self, ws: ClientConnection) -> None:
        failed = False
        try:
            while True:
                failed = await self._read_socket(ws, failed)
                resumed = None if failed else await self._resume(ws)
                if resumed is None:
                    break
                ws = resumed
        finally:
            outcome = self.machine.closed(ws.close_code, ws.close_reason or "")
            self._buffer.end(outcome)
            self._settled.set()
            self._closed.set()

    def _note(self, data: dict[str, Any]) -> None:
        """What resuming needs of a server message: its number, the token."""
        seq = data.get("seq")
        if isinstance(seq, int):
            self._last_seq = seq
        token = data.get("resume_token")
        if isinstance(token, str) and (self._resume_token is None or "seq" not in data):
            self._resume_token = token  # the first event's, then each session.resumed's
            grace = data.get("resume_grace_s")
            if isinstance(grace, int | float):
                self._resume_grace_s = float(grace)

    async def _resume(self, ws: ClientConnection) -> ClientConnection | None:
        """After a drop (no close frame), a new socket that resumes the
        session, retried with backoff within the server's grace period; None
        when the session cannot be resumed."""
        live = self.machine.state not in (SessionState.CLOSING, SessionState.CLOSED)
        if not (live and self._resume_token and ws.close_code in (None, ABNORMAL_CLOSE)):
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._resume_grace_s
        delay = RESUME_FIRST_RETRY_S
        self._resuming = True
        try:
            while (left := deadline - loop.time()) > 0:
                last = str(self._last_seq)
                url = with_query(self._socket_url(), resume_token=self._resume_token, last_seq=last)
                try:
                    self._ws = await open_socket(url, self.credentials, self._ssl, min(left, 10.0))
                except ConnectionFailedError:
                    await asyncio.sleep(min(delay, max(left, 0.0)))
                    delay = min(2 * delay, RESUME_MAX_RETRY_S)
                    continue
                except OmniliveError:
                    return None
                self.resumes += 1
                return self._ws
            return None
        finally:
            self._resuming = False

    async def _read_socket(self, ws: ClientConnection, failed: bool) -> bool:
        """Every message of one socket; True once the session failed."""
        try:
            async for raw in ws:
                if failed:
                    continue  # drain until the close completes
                try:
                    data = json.loads(raw)
                    if not isinstance(data, dict):
                        raise ProtocolViolationError("a server message is a JSON object")
                    self._note(data)
                    actions = self.machine.received(data)
                except (ValueError, ProtocolViolationError) as exc:
                    error = (
                        exc
                        if isinstance(exc, OmniliveError)
                        else ProtocolViolationError(f"a server message that is not JSON: {exc}")
                    )
                    actions, failed = self.machine.failed(error), True
                await self._apply(actions)
        except ConnectionClosed:
            pass
        return failed

    async def _apply(self, actions: list[Action]) -> None:
        assert self._ws is not None
        for action in actions:
            if isinstance(action, Deliver):
                self._observe(action.event)
                self._buffer.put(action.event)
            elif isinstance(action, Send):
                with contextlib.suppress(ConnectionClosed):  # the reader tells how it ended
                    await self._ws.send(json.dumps(dict(action.message)))
            elif isinstance(action, Ready):
                self._ready_event = action.event
                self._settled.set()
            elif isinstance(action, CloseSocket) and self._closer is None:
                # Its own task: the reader must keep draining for the close to complete.
                self._closer = asyncio.create_task(self._ws.close(), name=f"{self._name()}:close")


class PreparedSession(Session):
    """Half-duplex and duplex: ``prepare`` once queued, ready on ``prepared``,
    ended by ``stop`` (answered ``stopped``) or a ``timeout``."""

    STOP: ClassVar[Mapping[str, Any]]

    def __init__(
        self, url: str, prepare: Mapping[str, Any], **options: Unpack[ConnectOptions]
    ) -> None:
        self._prepare = prepare
        super().__init__(url, **options)

    def _rules(self) -> ModeRules:
        return ModeRules(ready=(Prepared,), ends=(Stopped, SessionTimeout), stop=self.STOP)

    def _configure_message(self) -> Mapping[str, Any]:
        return self._prepare
