"""API keys, client tokens and per-key limits on a real gateway (scripted workers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.security.conftest import ADMIN_KEY, USER_KEY, bearer
from tests.servers import Server, user

BOB_KEY = "bob-key-0123456789abcdef"
LIVE_KEYS = [
    {"key": ADMIN_KEY, "role": "admin", "requests_per_minute": 0, "max_sessions": 0},
    {"key": USER_KEY, "role": "user", "name": "alice", "max_sessions": 2},
    {"key": BOB_KEY, "role": "user", "name": "bob", "requests_per_minute": 5},
]


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[Server]:
    env = {"OMNILIVE_AUTH__KEYS": json.dumps(LIVE_KEYS), "OMNILIVE_SCRIPTED__SLOTS": "3"}
    server = Server(tmp_path, env=env, api_key=ADMIN_KEY).start()
    try:
        await server.wait_ready(workers=1)
        yield server
    finally:
        server.stop()


async def refused(url: str, **kwargs) -> tuple[int, dict]:
    """The HTTP status and JSON body of a refused WebSocket upgrade."""
    with pytest.raises(InvalidStatus) as caught:
        async with connect(url, **kwargs):
            pass
    response = caught.value.response
    return response.status_code, json.loads(response.body)


async def mint(server: Server, key: str, **body) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{server.http}/v1/client_secrets", headers=bearer(key), json=body, timeout=10
        )
    assert response.status_code == 200, response.text
    return response.json()["token"]


async def chat_done(url: str, **kwargs) -> dict:
    async with connect(url, **kwargs) as ws:
        await ws.send(json.dumps(user("hello with a key")))
        async for raw in ws:
            message = json.loads(raw)
            if message["type"] in ("done", "error"):
                return message
    raise AssertionError("no answer")


async def test_upgrades_need_a_key_or_a_token_checked_before_accept(keyed: Server):
    status, body = await refused(f"{keyed.ws}/ws/chat")
    assert status == 401 and body["code"] == "unauthorized"
    status, body = await refused(f"{keyed.ws}/ws/chat", additional_headers=bearer("nope" * 5))
    assert status == 401
    # an API key in the header, or a client token in the query or a subprotocol
    assert (await chat_done(f"{keyed.ws}/ws/chat", additional_headers=bearer(USER_KEY)))[
        "type"
    ] == "done"
    token = await mint(keyed, USER_KEY)
    assert (await chat_done(f"{keyed.ws}/ws/chat?token={token}"))["type"] == "done"
    async with connect(
        f"{keyed.ws}/ws/chat", subprotocols=["omnilive", f"omnilive.token.{token}"]
    ) as ws:
        assert ws.subprotocol == "omnilive"
    # tokens expire
    short = await mint(keyed, USER_KEY, ttl_s=1)
    await asyncio.sleep(1.2)
    status, body = await refused(f"{keyed.ws}/v1/realtime?mode=audio&token={short}")
    assert status == 401 and "expired" in body["error"]
    # a foreign page cannot use a key it does not have, nor a token it stole
    status, body = await refused(
        f"{keyed.ws}/ws/chat?token={token}", additional_headers={"Origin": "https://evil.example"}
    )
    assert status == 403 and body["code"] == "origin_not_allowed"
    assert f"token={token}" not in keyed.full_log()  # tokens stay out of the access log
    async with httpx.AsyncClient() as client:
        cancel = f"{keyed.http}/api/queue/q_nothing"
        assert (await client.delete(cancel, headers=bearer(USER_KEY))).status_code == 403
        assert (await client.delete(cancel, headers=bearer(ADMIN_KEY))).status_code == 404


async def test_sessions_per_key_just_under_passes_just_over_is_refused(keyed: Server):
    token = await mint(keyed, USER_KEY)  # tokens count against the key that minted them
    url = f"{keyed.ws}/ws/duplex/{{}}?mode=audio&token={token}"
    first = await connect(url.format("s1"))
    second = await connect(url.format("s2"), additional_headers=bearer(USER_KEY))
    try:
        for ws in (first, second):
            assert json.loads(await ws.recv())["type"] == "queue_done"
        status, body = await refused(url.format("s3"))
        assert status == 429 and body["code"] == "too_many_sessions"
        # other keys are not affected
        async with connect(url.format("s4").split("?")[0], additional_headers=bearer(ADMIN_KEY)):
            pass
    finally:
        await first.close()
    for _ in range(50):  # the place is given back when the first session ends
        try:
            async with connect(url.format("s5")) as ws:
                assert json.loads(await ws.recv())["type"] == "queue_done"
            break
        except InvalidStatus:
            await asyncio.sleep(0.1)
    else:
        raise AssertionError("the freed session place was not given back")
    await second.close()


async def test_requests_per_minute_just_under_passes_just_over_is_refused(keyed: Server):
    async with httpx.AsyncClient() as client:
        statuses = [
            (await client.get(f"{keyed.http}/api/apps", headers=bearer(BOB_KEY))).status_code
            for _ in range(5)
        ]
        assert statuses == [200] * 5
        over = await client.get(f"{keyed.http}/api/apps", headers=bearer(BOB_KEY))
        assert over.status_code == 429 and over.json()["code"] == "rate_limited"
        assert int(over.headers["retry-after"]) >= 1
        status, body = await refused(f"{keyed.ws}/ws/chat", additional_headers=bearer(BOB_KEY))
        assert status == 429 and body["code"] == "rate_limited"
        # the limit is per key
        alice = await client.get(f"{keyed.http}/api/apps", headers=bearer(USER_KEY))
        assert alice.status_code == 200


async def test_only_the_owner_or_an_admin_may_stop_a_session_over_rest(keyed: Server):
    url = f"{keyed.ws}/ws/half_duplex/alices"
    async with connect(url, additional_headers=bearer(USER_KEY)) as ws:
        assert json.loads(await ws.recv())["type"] == "queue_done"
        await ws.send(json.dumps({"type": "prepare"}))
        assert json.loads(await ws.recv())["type"] == "prepared"
        stop = f"{keyed.http}/api/half_duplex/stop"
        async with httpx.AsyncClient() as client:
            body = {"session_id": "alices"}
            bob = await client.post(stop, json=body, headers=bearer(BOB_KEY))
            assert bob.status_code == 404  # as if it did not exist
            alice = await client.post(stop, json=body, headers=bearer(USER_KEY))
            assert alice.status_code == 200
        assert json.loads(await ws.recv())["type"] == "stopped"
