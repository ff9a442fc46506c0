"""Real servers for the client's tests: one per test module (they start in
about a second), scripted unless a module asks for the cascade engine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Server


@contextlib.contextmanager
def running(tmp: Path, ready_timeout: float = 60.0, **options: Any) -> Iterator[Server]:
    """``omnilive serve`` until the block ends."""
    server = Server(tmp, **options).start()
    try:
        asyncio.run(server.wait_ready(timeout=ready_timeout, workers=1))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A scripted worker with room for four sessions at once."""
    env = {"OMNILIVE_SCRIPTED__SLOTS": "4"}
    with running(tmp_path_factory.mktemp("scripted"), env=env) as server:
        yield server
