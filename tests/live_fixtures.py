"""Fixtures for the tests that talk to a real gateway process (integration,
security): the conftest of each such folder imports them, so both folders
get the same server and the same clean-up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.clients import close_all
from tests.servers import Server


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Every session client a test opened is closed when it ends."""
    yield
    await close_all()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    """One scripted worker behind a real, open (keyless) gateway."""
    srv = Server(tmp_path).start()
    try:
        await srv.wait_ready(workers=1)
        yield srv
    finally:
        srv.stop()
