"""One-time passes for the sessions of calls run by media processes: one
use, one route, a lifetime, a bound; and the gatekeeper taking one as the
caller's credential (rate-limited as the caller), skipping nothing else."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from omnilive.config import AuthSettings, LimitSettings
from omnilive.gateway.access import WS
from omnilive.gateway.auth import AccessRequest, Denied, Gatekeeper
from omnilive.gateway.call_passes import PASS_HEADER, CallPasses
from omnilive.gateway.credentials import ANONYMOUS, Principal, Role

CALLER = Principal(key_id="k1", name="caller", role=Role.USER)
KEY = "user-key-0123456789abcdef"


def test_a_pass_opens_one_session_on_its_route():
    passes = CallPasses()
    secret = passes.mint(CALLER, "/v1/realtime")
    assert passes.redeem(secret, "/ws/half_duplex/x") is None  # another route: spent too
    secret = passes.mint(CALLER, "/v1/realtime")
    assert passes.redeem(secret, "/v1/realtime") == CALLER
    assert passes.redeem(secret, "/v1/realtime") is None
    assert passes.redeem("guessed", "/v1/realtime") is None and len(passes) == 0


def test_passes_lapse_and_are_bounded():
    now = [0.0]
    passes = CallPasses(ttl_s=10, max_outstanding=3, clock=lambda: now[0])
    old = passes.mint(CALLER, "/v1/realtime")
    now[0] = 11.0
    assert passes.redeem(old, "/v1/realtime") is None
    minted = [passes.mint(CALLER, "/v1/realtime") for _ in range(5)]
    assert len(passes) == 3  # the oldest lapsed first
    assert passes.redeem(minted[0], "/v1/realtime") is None
    assert passes.redeem(minted[-1], "/v1/realtime") == CALLER


def upgrade(path: str, headers: dict[str, str]) -> AccessRequest:
    return AccessRequest(method=WS, path=path, headers=Headers(headers), query={})


def keyed(requests_per_minute: int = 100) -> Gatekeeper:
    auth = AuthSettings(keys=[{"key": KEY}])  # type: ignore[list-item]
    limits = LimitSettings(requests_per_minute_per_key=requests_per_minute)
    return Gatekeeper.from_settings(auth, limits, [])


def test_the_gatekeeper_takes_a_pass_as_its_caller():
    gatekeeper = keyed()
    caller = gatekeeper.decide(upgrade("/v1/realtime", {"authorization": f"Bearer {KEY}"}))[1]
    assert caller is not None
    secret = gatekeeper.passes.mint(caller, "/v1/realtime")
    # No key, a loopback host and a foreign origin: the signalling request was checked.
    headers = {PASS_HEADER: secret, "host": "localhost", "origin": "https://elsewhere.example"}
    rule, principal = gatekeeper.decide(upgrade("/v1/realtime", headers))
    assert principal == caller and rule.opens_session
    with pytest.raises(Denied) as used:
        gatekeeper.decide(upgrade("/v1/realtime", headers))
    assert used.value.status == 401


def test_a_pass_counts_against_its_callers_rate():
    gatekeeper = keyed(requests_per_minute=1)
    caller = gatekeeper.decide(upgrade("/v1/realtime", {"authorization": f"Bearer {KEY}"}))[1]
    assert caller is not None
    secret = gatekeeper.passes.mint(caller, "/v1/realtime")
    with pytest.raises(Denied) as limited:
        gatekeeper.decide(upgrade("/v1/realtime", {PASS_HEADER: secret}))
    assert limited.value.status == 429


def test_an_open_gateway_takes_a_pass_as_anyone():
    gatekeeper = Gatekeeper.from_settings(AuthSettings(), LimitSettings(), [])
    secret = gatekeeper.passes.mint(ANONYMOUS, "/ws/duplex/dx")
    headers = {PASS_HEADER: secret, "host": "gateway.example"}  # not loopback: the pass decides
    assert gatekeeper.decide(upgrade("/ws/duplex/dx", headers))[1] == ANONYMOUS
