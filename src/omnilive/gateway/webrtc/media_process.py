"""A media process: runs the WebRTC calls the gateway hands it
(``media_pool.py``), so that Opus, SRTP, DTLS and the camera's frames cost
the gateway's event loop nothing.

``python -m omnilive.gateway.webrtc.media_process`` with its channel to the
gateway (one end of a socket pair) as file descriptor ``--channel-fd`` and
its settings, as JSON, in :data:`CONFIG_ENV`. It says :class:`Hello` once it
can take calls, then answers each :class:`OpenCall` with :class:`Answered`
(or :class:`Refused`) once the call's session began, as the gateway's own
calls do (``calls.open_here``), and says :class:`Closed` for each call whose
peer connection closed. The gateway closing the channel ends every call and
the process.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from omnilive.gateway.webrtc.media_wire import (
    Answered,
    Closed,
    Decoder,
    HangUp,
    Hello,
    Message,
    OpenCall,
    Refused,
    WireError,
    encode,
)
from omnilive.session_settings import WebRTCSettings

if TYPE_CHECKING:
    from omnilive.gateway.webrtc.calls import Calls

log = logging.getLogger(__name__)
CONFIG_ENV = "OMNILIVE_MEDIA_JSON"
READ_BYTES = 64 * 1024
# Replies the gateway has not read yet; past it, the gateway is stuck: stop.
MAX_UNSENT_BYTES = 4 * 1024 * 1024


class MediaConfig(BaseModel):
    """What a media process is told: only what its calls need."""

    name: str  # m0, m1, ... in its log lines
    webrtc: WebRTCSettings
    max_message_bytes: int
    gateway_socket: str  # the gateway's internal Unix socket
    tls: bool = False
    log_level: str = "info"
    log_json: bool = False
    log_stream: Literal["stderr", "stdout"] = "stderr"


class MediaServer:
    """The calls of this process, and its side of the channel."""

    def __init__(
        self,
        config: MediaConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        from omnilive.gateway.webrtc.calls import Calls  # imports aiortc
        from omnilive.gateway.webrtc.loopback import GatewaySocket
        from omnilive.tasks import TaskSet

        self.config = config
        self.gateway = GatewaySocket(config.gateway_socket, config.tls)
        self.reader, self.writer = reader, writer
        self.calls: Calls = Calls(config.webrtc, on_gone=self._closed)
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._tasks = TaskSet(f"media-{config.name}")

    async def run(self) -> None:
        """Serve the channel until the gateway closes it (or breaks it)."""
        self._send(Hello(os.getpid()))
        decoder = Decoder()
        try:
            while data := await self.reader.read(READ_BYTES):
                for message in decoder.feed(data):
                    self._take(message)
        except WireError as exc:
            log.error("media %s: the gateway's channel is broken: %s", self.config.name, exc)
        finally:
            await self._tasks.close()
            await self.calls.close()

    def _take(self, message: Message) -> None:
        if isinstance(message, OpenCall):
            task = self._tasks.spawn(message.call_id, self._open(message))
            self._opening[message.call_id] = task
            task.add_done_callback(lambda _: self._opening.pop(message.call_id, None))
        elif isinstance(message, HangUp):
            opening = self._opening.get(message.call_id)
            if opening is not None:
                opening.cancel()  # its client left before the answer
            call = self.calls.get(message.call_id, None, is_admin=True)
            if call is not None:
                call.close()
        else:
            log.warning("media %s: unexpected %s from the gateway", self.config.name, message.type)

    async def _open(self, opening: OpenCall) -> None:
        from omnilive.gateway.webrtc.call import Call
        from omnilive.gateway.webrtc.calls import open_here
        from omnilive.gateway.webrtc.dialects import Dialect, MediaDialect
        from omnilive.gateway.webrtc.loopback import loopback_app
        from omnilive.gateway.webrtc.offer import CallRefused, Offer

        dialect = MediaDialect(Dialect(opening.dialect))
        dialect.frame_max_side = opening.frame_max_side
        scope = {"type": "websocket", "path": opening.path}
        call = Call(opening.call_id, dialect, self.config.webrtc, scope,
                    list(opening.first_events), self.config.max_message_bytes)  # fmt: skip
        offer = Offer(opening.sdp, opening.media)
        app = loopback_app(self.gateway, opening)
        try:
            answer = await open_here(self.calls, call, None, offer, app)
        except CallRefused as refused:
            self._send(Refused(opening.call_id, refused.status, refused.code, refused.message))
            return
        self._send(Answered(opening.call_id, answer))

    def _closed(self, call_id: str) -> None:
        self._send(Closed(call_id))

    def _send(self, message: Message) -> None:
        if self.writer.is_closing():
            return  # the gateway is gone; the calls are ending
        if self.writer.transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            log.error("media %s: the gateway stopped reading its channel", self.config.name)
            self.writer.close()
            return
        self.writer.write(encode(message))


async def serve(config: MediaConfig, channel: socket.socket) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=channel)
    server = MediaServer(config, reader, writer)
    loop = asyncio.get_running_loop()
    running = asyncio.current_task()
    assert running is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, running.cancel)
    try:
        await server.run()
    except asyncio.CancelledError:
        log.info("media %s: stopped by a signal", config.name)
    finally:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An omnilive gateway's media process")
    parser.add_argument("--channel-fd", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        config = MediaConfig.model_validate_json(os.environ[CONFIG_ENV])
    except (KeyError, ValueError) as exc:
        print(f"omnilive media: no usable {CONFIG_ENV}: {exc}", file=sys.stderr)
        return 2
    from omnilive.gateway.webrtc import missing
    from omnilive.logs import configure_logging

    configure_logging(config.log_level, f"media {config.name}", config.log_json, config.log_stream)
    reason = missing()
    if reason is not None:
        print(f"omnilive media {config.name}: WebRTC cannot run: {reason}", file=sys.stderr)
        return 3
    channel = socket.socket(fileno=args.channel_fd)
    asyncio.run(serve(config, channel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
