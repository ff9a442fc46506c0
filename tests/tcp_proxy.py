"""A TCP proxy a test puts between a client and the gateway, to break the
network under a live session: :meth:`TcpProxy.cut` closes every connection
(both ends see it), :meth:`TcpProxy.blackhole` stops forwarding without a
close (both ends think the connection is alive, as on a dead Wi-Fi)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class TcpProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.holed = False
        self.accepted = 0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def ws(self) -> str:
        return f"ws://{self.host}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer), name="proxy:up"),
            asyncio.create_task(self._pipe(up_reader, writer), name="proxy:down"),
        ]
        self._pipes.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pipes.difference_update(pipes)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.holed:
                    continue  # swallowed: the peer never learns
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not self.holed:
                writer.close()

    def cut(self) -> None:
        """Reset every connection through the proxy now (new ones still work)."""
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    def blackhole(self) -> None:
        """Stop forwarding on every connection, without closing any."""
        self.holed = True

    async def close(self) -> None:
        self.holed = False
        self.cut()
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


class ProxyThread:
    """A :class:`TcpProxy` on its own event loop in a thread, for synchronous
    tests (the browser's): ``with ProxyThread(port) as proxy: proxy.cut()``."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy")
        self.proxy = TcpProxy(target_port)

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def port(self) -> int:
        return self.proxy.port

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self.proxy.cut)
