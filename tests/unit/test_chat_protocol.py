"""Gateway-side validation of chat requests: every refusal names the problem."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from omnilive.config import Settings
from omnilive.engines.base import Capabilities
from omnilive.engines.messages import Modality
from omnilive.gateway.pool import Pool
from omnilive.gateway.routes.chat import validate_chat
from omnilive.gateway.scheduler import WorkerHealth
from omnilive.gateway.state import Gateway
from omnilive.protocol.common import ErrorCode, ProtocolError


def pcm_b64(seconds: float) -> str:
    return base64.b64encode(np.zeros(int(16000 * seconds), "<f4").tobytes()).decode()


@pytest.fixture
async def gateway() -> Gateway:
    settings = Settings(internal_token="t")
    gateway = Gateway(settings, Pool(settings))
    return gateway


def refused(gateway: Gateway, payload: object) -> ProtocolError:
    raw = payload if isinstance(payload, str) else json.dumps(payload)
    with pytest.raises(ProtocolError) as info:
        validate_chat(gateway, raw)
    return info.value


async def test_valid_request_with_defaults(gateway):
    request = validate_chat(gateway, json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    assert request.streaming is True
    assert request.generation.max_new_tokens == 512
    assert request.generation.temperature == 0.7 and request.generation.top_p == 0.8
    assert request.tts.enabled is True and request.tts.mode == "default"
    assert request.image.max_slice_nums is None and request.image.use_image_id is True


async def test_bad_json(gateway):
    assert refused(gateway, "{not json").code is ErrorCode.INVALID_JSON
    assert refused(gateway, "[1, 2]").code is ErrorCode.INVALID_REQUEST


async def test_unknown_content_type_is_named(gateway):
    err = refused(gateway, {"messages": [{"role": "user", "content": [{"type": "smell"}]}]})
    assert err.code is ErrorCode.INVALID_REQUEST
    assert "smell" in err.message and "content" in err.message


async def test_undecodable_base64_is_named(gateway):
    bad = {"messages": [{"role": "user", "content": [{"type": "audio", "data": "@@@"}]}]}
    err = refused(gateway, bad)
    assert "base64" in err.message and "data" in err.message


async def test_audio_must_be_whole_float32_samples(gateway):
    odd = base64.b64encode(b"\x00" * 6).decode()
    err = refused(
        gateway, {"messages": [{"role": "user", "content": [{"type": "audio", "data": odd}]}]}
    )
    assert "multiple of 4" in err.message


async def test_oversize_message(gateway):
    gateway.settings.limits.max_message_bytes = 1000
    err = refused(gateway, {"messages": [{"role": "user", "content": "x" * 2000}]})
    assert err.code is ErrorCode.PAYLOAD_TOO_LARGE


async def test_too_much_audio(gateway):
    gateway.settings.limits.max_chat_audio_s = 1.0
    content = [{"type": "audio", "data": pcm_b64(1.5)}]
    err = refused(gateway, {"messages": [{"role": "user", "content": content}]})
    assert err.code is ErrorCode.PAYLOAD_TOO_LARGE and "audio" in err.message


async def test_server_paths_are_refused(gateway):
    err = refused(gateway, {"messages": [{"role": "user", "content": "hi"}],
                            "tts": {"ref_audio_path": "/etc/passwd"}})  # fmt: skip
    assert "ref_audio_path" in err.message


async def test_missing_capability_is_named(gateway):
    caps = Capabilities(frozenset({Modality.TEXT, Modality.AUDIO}), True, False, 2048)
    gateway.pool.add_worker("w0", "http://w0")
    gateway.pool.set_worker_state("w0", WorkerHealth.READY, 1, caps.to_dict())
    image = base64.b64encode(b"jpeg").decode()
    err = refused(
        gateway, {"messages": [{"role": "user", "content": [{"type": "image", "data": image}]}]}
    )
    assert err.code is ErrorCode.UNSUPPORTED and "vision" in err.message


async def test_roles_and_empty_messages(gateway):
    assert refused(gateway, {"messages": []}).code is ErrorCode.INVALID_REQUEST
    err = refused(gateway, {"messages": [{"role": "robot", "content": "x"}]})
    assert "role" in err.message
