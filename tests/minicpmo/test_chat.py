"""Chat through the simplex streaming API: a fresh context, every message, one answer."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from omnilive.engines.base import CapabilityError, EngineError
from omnilive.engines.messages import (
    AudioPart,
    ChatMessage,
    ChatOptions,
    GenerationOptions,
    ImagePart,
    TextPart,
    VideoPart,
    Voice,
)
from tests.minicpmo.conftest import EngineFactory, voice


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (32, 24), 128).save(buffer, "PNG")
    return buffer.getvalue()


MESSAGES = [
    ChatMessage("system", (TextPart("Be brief."),)),
    ChatMessage("user", (TextPart("What is this?"), ImagePart(png()), AudioPart(voice(1.0)))),
]


def test_streams_text_with_24khz_audio_in_the_request_voice(make_engine: EngineFactory):
    engine, backend = make_engine()
    model = backend.model
    chat = engine.open_chat()
    reference = voice(2.0, seed=3)
    options = ChatOptions(generation=GenerationOptions(max_new_tokens=64), voice=Voice(reference))
    input_tokens = chat.prefill(MESSAGES, options)
    assert input_tokens == model.llm_past_key_values.get_seq_length() > 0
    assert model.voices[-1] is reference  # the request's voice, not the default
    chunks = list(chat.generate())
    assert len(chunks) == 3 and all(
        c.audio is not None and c.audio.dtype == np.float32 for c in chunks
    )
    assert "".join(c.text for c in chunks).startswith(f"heard{input_tokens}")
    # n_tokens: what each piece added to the context, the assistant prefix included
    assert (
        sum(c.n_tokens for c in chunks) == model.llm_past_key_values.get_seq_length() - input_tokens
    )
    roles = [(p["role"], p["is_last_chunk"], p["stream_input"]) for p in model.prefills]
    assert roles == [("system", False, False), ("user", True, False)]
    content = model.prefills[1]["content"]
    assert content[0] == "What is this?" and isinstance(content[1], Image.Image)
    assert isinstance(content[2], np.ndarray) and content[2].dtype == np.float32
    assert model.generations[-1]["generate_audio"] and model.generations[-1]["max_new_tokens"] == 64
    chat.close()
    assert model.live == 0 and backend.releases >= 1


def test_the_default_voice_when_the_request_has_none(make_engine: EngineFactory):
    engine, backend = make_engine()
    chat = engine.open_chat()
    chat.prefill(MESSAGES, ChatOptions())
    assert len(backend.model.voices) == 1 and backend.model.voices[0].size == 32000
    assert all(c.audio is not None for c in chat.generate())
    chat.close()


def test_text_only_when_tts_is_off_or_no_voice_exists(make_engine: EngineFactory):
    engine, backend = make_engine()
    chat = engine.open_chat()
    chat.prefill(MESSAGES, ChatOptions(tts_enabled=False))
    chunks = list(chat.generate())
    assert chunks and all(c.audio is None for c in chunks)
    assert backend.model.generations[-1]["generate_audio"] is False
    chat.close()
    voiceless, backend = make_engine(default_voice=None)
    chat = voiceless.open_chat()
    chat.prefill(MESSAGES, ChatOptions())
    assert all(c.audio is None for c in chat.generate())
    chat.close()


def test_a_fresh_context_per_request(make_engine: EngineFactory):
    engine, backend = make_engine()
    lengths = []
    for _ in range(2):
        chat = engine.open_chat()
        lengths.append(chat.prefill(MESSAGES, ChatOptions(tts_enabled=False)))
        list(chat.generate())
        chat.close()
    assert lengths[0] == lengths[1]
    sessions = {p["session_id"] for p in backend.model.prefills}
    assert len(sessions) == 2


def test_video_is_a_missing_capability_and_touches_no_model(make_engine: EngineFactory):
    engine, backend = make_engine()
    chat = engine.open_chat()
    with pytest.raises(CapabilityError, match="video input"):
        chat.prefill([ChatMessage("user", (VideoPart(b"mp4"),))], ChatOptions())
    assert backend.model.prefills == []


def test_model_failures_become_engine_errors(make_engine: EngineFactory):
    engine, backend = make_engine()
    backend.model.fail_prefill = True
    with pytest.raises(EngineError, match="prefill: RuntimeError: prefill exploded"):
        engine.open_chat().prefill(MESSAGES, ChatOptions())
    backend.model.fail_prefill = False
    backend.model.fail_generate_after = 4
    chat = engine.open_chat()
    chat.prefill(MESSAGES, ChatOptions())
    chunks = chat.generate()
    next(chunks)
    with pytest.raises(EngineError, match="generation exploded"):
        next(chunks)
    chat.close()
    assert backend.model.live == 0


def test_a_voice_is_prepared_once_and_put_back_for_later_requests(make_engine: EngineFactory):
    engine, backend = make_engine()
    model = backend.model
    first, second = voice(2.0, seed=5), voice(2.0, seed=6)

    def chat_in(reference: np.ndarray) -> tuple:
        chat = engine.open_chat()
        generation = GenerationOptions(max_new_tokens=8)
        chat.prefill(MESSAGES, ChatOptions(generation=generation, voice=Voice(reference)))
        prepared = (model.token2wav_cache, model.tts.audio_tokenizer.cache)
        assert all(chunk.audio is not None for chunk in chat.generate())
        chat.close()
        assert model.token2wav_cache is None  # each session's end resets the model
        return prepared

    once = chat_in(first)
    assert len(model.voices) == 1
    assert chat_in(first.copy()) == once  # same samples: put back, not prepared again
    assert len(model.voices) == 1
    other = chat_in(second)
    assert len(model.voices) == 2 and other != once
    assert chat_in(first) == once and len(model.voices) == 2
    for seed in range(7, 11):  # four more voices: the first is no longer kept
        chat_in(voice(1.0, seed=seed))
    chat_in(first)
    assert len(model.voices) == 7 and model.voices[-1] is first
