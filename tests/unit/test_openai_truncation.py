"""The OpenAI GA dialect's ``session.truncation``: shown back as set, given
to the engine as its rule (:class:`HistoryTruncation`), refused outside
OpenAI's bounds."""

from __future__ import annotations

import json

from omnilive.engines.messages import HistoryTruncation
from omnilive.protocol.openai_realtime import SessionConfig, server_event, session_object
from omnilive.worker.openai.machine import options
from tests.unit.test_realtime_openai import client, conforms, machine


def test_truncation_is_kept_as_set_and_reaches_the_engine():
    """``session.truncation``: "auto" (the default), "disabled", or a
    retention ratio with a token limit; shown back as OpenAI's schema has
    it, given to the engine as its rule, and refused outside its bounds."""
    assert session_object("s", SessionConfig(), "m")["truncation"] == "auto"
    assert options(SessionConfig()).truncation == HistoryTruncation()
    ratio = {"type": "retention_ratio", "retention_ratio": 0.8,
             "token_limits": {"post_instructions": 5000}}  # fmt: skip
    for asked, rule in [
        ("disabled", HistoryTruncation(enabled=False)),
        (ratio, HistoryTruncation(limit_tokens=5000, retention_ratio=0.8)),
        (
            {"type": "retention_ratio", "retention_ratio": 0.5},
            HistoryTruncation(retention_ratio=0.5),
        ),
    ]:
        config = SessionConfig().updated(SessionConfig.model_validate({"truncation": asked}))
        shown = server_event("session.updated", session=session_object("s", config, "m"))
        conforms(shown)
        assert shown["session"]["truncation"] == asked
        assert options(config).truncation == rule
        assert options(config.updated(SessionConfig())).truncation == rule  # kept by updates
    m = machine()
    m.attach_worker()
    for bad in ["sometimes", {"type": "retention_ratio", "retention_ratio": 1.5},
                {"type": "retention_ratio", "retention_ratio": 0.5,
                 "token_limits": {"post_instructions": 0}}]:  # fmt: skip
        update = {"type": "session.update", "session": {"truncation": bad}}
        [error] = client(m.client_frame(json.dumps(update)))
        conforms(error)
        assert error["error"]["code"] == "invalid_value"
        assert error["error"]["param"].startswith("session.truncation")
