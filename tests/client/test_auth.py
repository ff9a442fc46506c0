"""API keys and client tokens on a real gateway with keys: what works, and
each refusal as the exception of its code."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from omnilive.client import Chat, Duplex, HalfDuplex, Realtime, client_token
from omnilive.client.errors import (
    ConnectionFailedError,
    RateLimitedError,
    TooManySessionsError,
    UnauthorizedError,
)
from tests.servers import Server, free_port, running

ADMIN = "admin-key-0123456789abcdef"
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef"
KEYS = [
    {"key": ADMIN, "role": "admin", "requests_per_minute": 0, "max_sessions": 0},
    {"key": ALICE, "role": "user", "name": "alice", "max_sessions": 2, "requests_per_minute": 0},
    {"key": BOB, "role": "user", "name": "bob", "requests_per_minute": 2},
]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"OMNILIVE_AUTH__KEYS": json.dumps(KEYS), "OMNILIVE_SCRIPTED__SLOTS": "4"}
    with running(tmp_path_factory.mktemp("keyed"), env=env, api_key=ADMIN) as server:
        yield server


async def test_a_key_or_a_token_opens_every_mode(keyed: Server):
    reply = await Chat(keyed.http, key=ALICE).ask("Hi with a key")
    assert reply.text == "You said: Hi with a key"
    minted = await client_token(keyed.http, ALICE, ttl_s=60)
    assert minted.token and minted.ttl_s == 60
    async with HalfDuplex(keyed.http, token=minted.token) as session:
        assert session.queue.done
    async with Realtime(keyed.ws, mode="chat", token=minted.token) as session:
        assert (await session.ask("Hi with a token")).text == "You said: Hi with a token"


async def test_refusals_are_typed(keyed: Server):
    with pytest.raises(UnauthorizedError) as missing:
        await Chat(keyed.http).ask("Hi")
    assert missing.value.details["status"] == 401
    with pytest.raises(UnauthorizedError):
        await Chat(keyed.http, key="wrong-key-0123456789abcdef").ask("Hi")
    minted = await client_token(keyed.http, ALICE)
    with pytest.raises(UnauthorizedError):  # a token cannot mint tokens
        await client_token(keyed.http, minted.token)
    with pytest.raises(ConnectionFailedError):
        await Chat(f"http://127.0.0.1:{free_port()}").ask("nobody listens")


async def test_per_key_limits_are_typed(keyed: Server):
    async with Duplex(keyed.http, key=ALICE), Duplex(keyed.http, key=ALICE):
        with pytest.raises(TooManySessionsError) as too_many:
            async with Duplex(keyed.http, key=ALICE):
                pass
        assert too_many.value.details["status"] == 429
    for _ in range(2):
        await Chat(keyed.http, key=BOB).ask("within the limit")
    with pytest.raises(RateLimitedError) as limited:
        await Chat(keyed.http, key=BOB).ask("over it")
    assert limited.value.details["retry_after_s"] >= 1
