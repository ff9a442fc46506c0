"""Fixtures for the tests that talk to a real gateway process (integration,
security): the conftest of each such folder imports them, so both folders
get the same server and the same clean-up.

``server`` is a scripted server with the default settings. A test gets one
of its own, unless its module is marked ``shared_server``: the module's
tests then take one server in turn (it starts in about three seconds, and
most tests only open sessions on it). Each gets it idle, its worker the
same process it was; a test that leaves it otherwise (a session that does
not end, a worker killed or restarted, the server stopped) gets it stopped,
and the next test a new one. A test of such a module that changes what the
next would see (settings through the admin routes, recordings it counts, the
log it reads) is marked ``fresh_server``, and gets one of its own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clients import close_all
from tests.servers import Server

log = logging.getLogger(__name__)

# A shared server holds a dropped session this long for a resume (the
# default is 30 s): the next test waits for it to end. Tests of resuming
# run on servers of their own.
SHARED_RESUME_GRACE_S = "2"
IDLE_TIMEOUT_S = 15.0


class SharedServer:
    """One module's server, started at its first use and after a test that
    left it dirty (see the module)."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = {"OMNILIVE_LIMITS__RESUME_GRACE_S": SHARED_RESUME_GRACE_S, **env}
        self.server: Server | None = None
        self.worker: dict[str, Any] | None = None  # w0 as the last test found it
        self.starts = 0

    async def take(self) -> Server:
        if self.server is None:
            self.starts += 1
            folder = self.tmp / f"start-{self.starts}"
            folder.mkdir()
            server = Server(folder, env=self.env).start()
            try:
                await server.wait_ready(workers=1)
                self.worker = await self._worker(server)
            except BaseException:
                server.stop()
                raise
            self.server = server
        return self.server

    async def give_back(self, name: str) -> None:
        """After a test: the server stays if it is idle and its worker is
        the process it was; else it is stopped (the next test starts one)."""
        server = self.server
        if server is None:
            return
        why = None
        try:
            if server.process is None or server.process.poll() is not None:
                why = "it was stopped"
            else:
                await server.wait_idle(timeout=IDLE_TIMEOUT_S)
                if await self._worker(server) != self.worker:
                    why = "its worker changed"
        except (TimeoutError, OSError, ValueError, KeyError) as exc:
            why = f"it did not come back idle ({type(exc).__name__})"
        if why is not None:
            log.warning("the shared server is restarted after %s: %s", name, why)
            self.stop()

    @staticmethod
    async def _worker(server: Server) -> dict[str, Any]:
        [worker] = (await server.get("/workers"))["workers"]
        return {k: worker[k] for k in ("pid", "restarts")}

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Every session client a test opened is closed when it ends."""
    yield
    await close_all()


@pytest.fixture(scope="module")
def _module_server(request: pytest.FixtureRequest) -> Iterator[SharedServer]:
    marker = request.node.get_closest_marker("shared_server")
    env = dict(marker.kwargs.get("env", {})) if marker is not None else {}
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    shared = SharedServer(factory.mktemp("shared"), env)
    yield shared
    shared.stop()


@pytest.fixture
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Server]:
    """A scripted worker behind a real, open (keyless) gateway: the test's
    own, or its module's shared one (see the module)."""
    node = request.node
    if node.get_closest_marker("shared_server") and not node.get_closest_marker("fresh_server"):
        shared: SharedServer = request.getfixturevalue("_module_server")
        taken = await shared.take()
        try:
            yield taken
        finally:
            await close_all()  # the test's clients end their sessions first
            await shared.give_back(node.nodeid)
        return
    srv = Server(tmp_path).start()
    try:
        await srv.wait_ready(workers=1)
        yield srv
    finally:
        srv.stop()
