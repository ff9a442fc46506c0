"""Servers shared by the browser tests: one scripted server for the whole
run (tests that change its settings put them back), and a cascade server
for the tests that need real speech recognition."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.harness import run_async
from tests.servers import Server


def _serve(
    tmp_path_factory: pytest.TempPathFactory,
    engine: str,
    *,
    name: str | None = None,
    env: dict[str, str] | None = None,
    api_key: str | None = None,
) -> Iterator[Server]:
    """A ready server of ``engine`` until the generator closes. ``name`` (the
    engine unless given) names its temporary folder; ``env`` and ``api_key``
    go to :class:`Server`, e.g. for a server with API keys."""
    tmp = tmp_path_factory.mktemp(f"browser-{name or engine}")
    server = Server(tmp, engine=engine, env=env, api_key=api_key).start()
    try:
        run_async(server.wait_ready(timeout=180, workers=1))
        yield server
    finally:
        server.stop()


# The shared scripted server holds a dropped session this long for a resume
# (the default is 30 s), which the next test waits out: long enough for a
# page's reconnect (test_resume.py), well short of the default.
SHARED_RESUME_GRACE_S = 8.0


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"OMNILIVE_LIMITS__RESUME_GRACE_S": str(SHARED_RESUME_GRACE_S)}
    yield from _serve(tmp_path_factory, "scripted", env=env)


@pytest.fixture(scope="module")
def cascade_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _serve(tmp_path_factory, "cascade")


@pytest.fixture(autouse=True)
def _shared_server_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the shared scripted server, wait until it has no
    session: closing a page ends its session, but not before the test returns.
    A dropped session is held for the resume grace, hence the timeout."""
    yield
    if "scripted_server" in request.fixturenames:
        server: Server = request.getfixturevalue("scripted_server")
        run_async(server.wait_idle(timeout=SHARED_RESUME_GRACE_S + 10))
