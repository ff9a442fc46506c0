"""Real servers for the client's tests: one per test module (they start in
about a second), scripted unless a module asks for the cascade engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import Server, running


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A scripted worker with room for four sessions at once."""
    env = {"OMNILIVE_SCRIPTED__SLOTS": "4"}
    with running(tmp_path_factory.mktemp("scripted"), env=env) as server:
        yield server
