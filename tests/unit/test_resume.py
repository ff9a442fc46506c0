"""The socket-free part of resume (``gateway/resume.py``): the replay log,
the token table, and how a connection asks to resume."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnilive.gateway.resume import (
    ReplayLog,
    ResumeRefused,
    ResumeRequest,
    ResumeTable,
    asks_resume,
    resume_request_of,
    stamped,
)
from omnilive.protocol.common import ErrorCode, ProtocolError


def event(n: int, size: int = 10) -> str:
    return json.dumps({"type": "chunk", "n": n, "pad": "x" * size})


def test_the_log_numbers_events_and_stamps_the_first_with_the_token():
    log = ReplayLog(100, 1 << 20, numbered=True)
    log.first_fields = {"resume_token": "t"}
    for n in range(1, 4):
        assert log.append(event(n)) == n
    first, second, third = (json.loads(text) for _, text in log.after(0))
    assert first["seq"] == 1 and first["resume_token"] == "t" and first["n"] == 1
    assert second == {"seq": 2, "type": "chunk", "n": 2, "pad": "x" * 10}
    assert third["seq"] == 3
    assert [seq for seq, _ in log.after(1)] == [2, 3]
    assert log.after(3) == [] and log.after(99) == []


def test_unnumbered_events_stay_as_they_were_but_the_first():
    log = ReplayLog(100, 1 << 20, numbered=False)
    log.first_fields = {"resume_token": "t"}
    log.append(event(1))
    log.append(event(2))
    assert "resume_token" in log.after(0)[0][1]
    assert log.after(1)[0][1] == event(2)


def test_overflow_drops_the_oldest_and_a_late_resume_is_told_how_many():
    log = ReplayLog(4, 1 << 20, numbered=True)
    for n in range(1, 11):
        log.append(event(n))
    assert [seq for seq, _ in log.after(0)] == [7, 8, 9, 10]
    assert log.dropped == 6 and log.missing(0) == 6 and log.missing(6) == 0
    assert log.missing(8) == 0


def test_the_byte_bound_keeps_at_least_the_newest_event():
    log = ReplayLog(100, 100, numbered=False)
    log.append(event(1, 500))
    log.append(event(2, 500))
    assert [seq for seq, _ in log.after(0)] == [2]


def test_stamped_handles_an_empty_object():
    assert json.loads(stamped("{}", {"seq": 1})) == {"seq": 1}
    assert stamped("[1]", {"seq": 1}) == "[1]"


def test_a_token_resumes_only_for_its_key_and_route_while_open():
    table: ResumeTable[object] = ResumeTable()
    handle = object()
    token = table.mint(handle, "key-a", "half_duplex")
    with pytest.raises(ResumeRefused, match="cannot be resumed now"):
        table.claim(token, "key-a", "half_duplex")
    table.set_open(handle, True)
    with pytest.raises(ResumeRefused, match="another API key"):
        table.claim(token, "key-b", "half_duplex")
    with pytest.raises(ResumeRefused, match="for a half_duplex session"):
        table.claim(token, "key-a", "duplex")
    with pytest.raises(ResumeRefused, match="unknown or expired"):
        table.claim(token + "x", "key-a", "half_duplex")
    assert table.claim(token, "key-a", "half_duplex") is handle
    # not used up: a client that lost session.resumed can come back
    assert table.claim(token, "key-a", "half_duplex") is handle
    table.forget(handle)
    assert len(table) == 0
    with pytest.raises(ResumeRefused, match="unknown or expired"):
        table.claim(token, "key-a", "half_duplex")


def test_a_resume_is_asked_by_query_or_subprotocol():
    assert resume_request_of({}, ()) is None
    assert resume_request_of({"resume_token": "t", "last_seq": "4"}, ()) == ResumeRequest("t", 4)
    offered = ("omnilive", "omnilive.resume.t", "omnilive.last_seq.9")
    assert resume_request_of({}, offered) == ResumeRequest("t", 9)
    assert asks_resume({}, offered) and not asks_resume({"token": "x"}, ("omnilive",))
    for bad in ({"resume_token": "t", "last_seq": "-1"}, {"resume_token": ""}):
        with pytest.raises(ProtocolError) as info:
            resume_request_of(bad, ())
        assert info.value.code is ErrorCode.RESUME_REFUSED


@given(st.dictionaries(st.sampled_from(["resume_token", "last_seq", "x"]), st.text()))
def test_any_query_is_a_request_none_or_a_documented_refusal(query: dict[str, str]):
    try:
        request = resume_request_of(query, ())
    except ProtocolError as exc:
        assert exc.code is ErrorCode.RESUME_REFUSED
    else:
        assert request is None or (request.token and request.last_seq >= 0)
