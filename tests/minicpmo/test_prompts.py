"""The chats' prompts encoded together (sessions/prompts.py) against the
model code's own ``get_vllm_embedding`` + ``get_omni_embedding`` one prompt
at a time, on the CPU with the tiny checkpoint of the published
architecture. Skipped where the model code is not at hand (``model_code.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.minicpmo.model_code import needs_model_code

pytestmark = needs_model_code


@pytest.fixture(scope="module")
def shared(tiny_shared: Any) -> Any:
    return tiny_shared


def inputs(shared: Any, text: str, seconds: float | None, seed: int) -> Any:
    from omnilive.engines.minicpmo.sessions.simplex.prompts import prompt_inputs

    audios = []
    prompt = f"<|im_start|>user\n{text}"
    if seconds is not None:
        rng = np.random.default_rng(seed)
        audios = [rng.normal(0, 0.1, int(16_000 * seconds)).astype(np.float32)]
        prompt += "<audio>./</audio>"
    return prompt_inputs(shared, prompt, [], audios, None, first=True)


def alone(shared: Any, given: Any) -> torch.Tensor:
    """The model code's own path for one prompt."""
    model = shared.model
    with torch.no_grad():
        embeds, _ = model.get_vllm_embedding(given)
        embeds = model.get_omni_embedding(given, input_embeddings=embeds, stream_input=False)
    return embeds[0]


def test_prompts_of_mixed_lengths_encode_together_as_each_alone(shared: Any) -> None:
    from omnilive.engines.minicpmo.sessions.simplex.prompts import prompt_embeddings

    lengths = [2.0, None, 1.5, 2.0, 1.0, 2.0]  # three of one width, one text-only
    batch = [inputs(shared, f"question {i}", s, i) for i, s in enumerate(lengths)]
    assert sum(1 for s in lengths if s is not None) == 5
    expected = [alone(shared, given) for given in batch]
    got = prompt_embeddings(shared, batch)
    for given, want, made, seconds in zip(batch, expected, got, lengths, strict=True):
        assert isinstance(made, torch.Tensor)
        assert made.shape == want.shape
        assert float((made - want).abs().max()) < 1e-4
        if seconds is not None:  # the audio was placed: not the placeholders' embeddings
            with torch.no_grad():
                text_only, _ = shared.model.get_vllm_embedding(given)
            assert float((made - text_only[0]).abs().max()) > 1e-3


def test_a_prompt_whose_placeholders_do_not_fit_its_audio_fails_alone(shared: Any) -> None:
    from omnilive.engines.minicpmo.sessions.encoders.units import Failed
    from omnilive.engines.minicpmo.sessions.simplex.prompts import prompt_embeddings

    good = inputs(shared, "fine", 1.0, 0)
    bad = inputs(shared, "broken", 1.0, 1)
    bounds = bad["audio_bounds"][0]
    bad["audio_bounds"] = [bounds[:, :] - torch.tensor([0, 1])]  # one placeholder short
    got = prompt_embeddings(shared, [bad, good])
    assert isinstance(got[0], Failed) and "placeholders" in str(got[0].error)
    assert isinstance(got[1], torch.Tensor)
    assert float((got[1] - alone(shared, good)).abs().max()) < 1e-4


def test_a_prompt_that_breaks_its_width_groups_whisper_call_fails_alone(shared: Any) -> None:
    from omnilive.engines.minicpmo.sessions.encoders.units import Failed
    from omnilive.engines.minicpmo.sessions.simplex.prompts import prompt_embeddings

    first = inputs(shared, "first", 1.0, 0)
    bad = inputs(shared, "broken", 1.0, 1)
    last = inputs(shared, "last", 1.0, 2)
    # One mel bin short, at the group's width: the group's batched call cannot run.
    bad["audio_features"] = bad["audio_features"][:, :-1, :]
    assert bad["audio_features"].shape[-1] == first["audio_features"].shape[-1]
    got = prompt_embeddings(shared, [first, bad, last])
    assert isinstance(got[1], Failed)
    for given, made in ((first, got[0]), (last, got[2])):
        assert isinstance(made, torch.Tensor)
        assert float((made - alone(shared, given)).abs().max()) < 1e-4


def test_a_prompt_is_processed_while_a_duplex_session_holds_the_mel_lock(shared: Any) -> None:
    """The chats' processor has a feature extractor of its own: a prompt does
    not wait for the streaming mel processors' lock, and its features are
    the shared extractor's in the mode as loaded, whatever mode the
    streaming processors left that one in."""
    import threading

    from omnilive.engines.minicpmo.runtime.tensors import swapped

    extractor = shared.processor.audio_processor
    assert shared.prompt_processor.audio_processor is not extractor
    made: list[Any] = []
    streaming_mode = {name: None for name in shared.voice_mel_mode}  # as a session leaves it
    with shared.mel_lock, swapped(extractor, streaming_mode):
        worker = threading.Thread(target=lambda: made.append(inputs(shared, "hi", 1.0, 3)))
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "the prompt waited for the mel lock"
    rng = np.random.default_rng(3)
    audio = rng.normal(0, 0.1, 16_000).astype(np.float32)
    with swapped(extractor, dict(shared.voice_mel_mode)):
        expected = shared.processor.process_audio([audio])
    got = made[0]["audio_features"][0]
    want = expected["audio_features"][0]
    assert got.shape == want.shape and torch.equal(got, want)
