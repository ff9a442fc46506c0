"""The vocoder's flow model and HiFT, small and random, built from
minicpmo-utils' own modules on the CPU: :class:`FlowRunner`'s chunk makes
what the package's own ``inference_chunk`` makes, and the chunks of several
sessions' streams run as one batch sound as each stream alone.

Only the package's modules are imported (its top level loads the ONNX prompt
models, which are not public); the DiT keeps the sizes its scratch buffers
are made for (8 heads of 64, 512 wide), with 2 blocks instead of 16."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch

from omnilive.engines.minicpmo.sessions.duplex.unit_rules import SILENCE_TOKEN
from omnilive.engines.minicpmo.sessions.voice.flow import (
    PROMPT_TAIL_FRAMES,
    FlowRunner,
    FlowState,
    graph_model_code_flow,
    keep_frequencies,
)
from omnilive.engines.minicpmo.sessions.voice.vocoder import (
    VOCODER_CHUNK,
    VoiceStream,
    voice_together,
)

SPEECH_TOKENS = 6561
STEPS = 10  # the flow's Euler steps, as the real vocoder


def package(name: str) -> Any:
    """A module of the installed ``stepaudio2`` without running its top level
    (nor disturbing the stand-in ``stepaudio2`` other tests' checkpoints load)."""
    # The installed package's folder (a checkpoint's stand-in may be on the path first).
    folder = importlib.metadata.distribution("minicpmo-utils").locate_file("stepaudio2")
    top = types.ModuleType("stepaudio2")
    top.__path__ = [str(folder)]
    saved = sys.modules.get("stepaudio2")
    sys.modules["stepaudio2"] = top
    try:
        return importlib.import_module(f"stepaudio2.{name}")
    finally:
        if saved is None:
            del sys.modules["stepaudio2"]
        else:
            sys.modules["stepaudio2"] = saved


class SmallVocoder:
    """What :class:`FlowRunner` reads of a ``Token2wav``: a small random flow
    model and HiFT, and a voice prompt made from the prompt's name (the real
    one runs the ONNX speech tokenizer and speaker model on the recording)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        encoder = package("cosyvoice2.transformer.upsample_encoder_v2").UpsampleConformerEncoderV2(
            input_size=64, output_size=64, input_layer="linear", pre_lookahead_len=3,
            num_blocks=1, num_up_blocks=1, up_stride=2, up_scale_factor=2, attention_heads=2,
            pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn",
            key_bias=True, linear_units=64, dropout_rate=0.0, positional_dropout_rate=0.0,
            attention_dropout_rate=0.0, normalize_before=True,
        )  # fmt: skip
        estimator = package("cosyvoice2.flow.decoder_dit").DiT(
            in_channels=320, out_channels=80, mlp_ratio=1.0, depth=2, num_heads=8, head_dim=64,
            hidden_size=512,
        )  # fmt: skip
        decoder = package("cosyvoice2.flow.flow_matching").CausalConditionalCFM(
            estimator=estimator, inference_cfg_rate=0.7
        )
        self.flow = package("cosyvoice2.flow.flow").CausalMaskedDiffWithXvec(
            input_size=64, output_size=80, spk_embed_dim=192, output_type="mel",
            vocab_size=SPEECH_TOKENS, encoder=encoder, decoder=decoder,
        ).eval()  # fmt: skip
        self.hift = package("flashcosyvoice.modules.hifigan").HiFTGenerator(base_channels=32).eval()
        self.float16 = False
        self.n_timesteps = STEPS
        self.mel_cache_len = 8
        self.source_cache_len = self.mel_cache_len * 480
        self.speech_window = torch.from_numpy(np.hamming(2 * self.source_cache_len)).float()
        self.cache: Any = None
        self.stream_cache: Any = None

    @torch.inference_mode()
    def set_stream_cache(self, prompt_wav: str) -> tuple[dict, dict]:
        generator = torch.Generator().manual_seed(len(prompt_wav))
        count = 8 + len(prompt_wav)  # prompt tokens: voices of different lengths
        tokens = torch.randint(0, SPEECH_TOKENS, (1, count), generator=generator)
        speaker = torch.randn(1, 192, generator=generator)
        mels = torch.randn(1, count * 2, 80, generator=generator) - 6.0
        self.cache = (tokens, None, speaker, mels, None)
        padded = torch.cat([tokens, torch.full((1, 3), SILENCE_TOKEN)], 1)
        flow = self.flow.setup_cache(padded, mels, speaker, n_timesteps=STEPS)
        empty = {"mel": torch.zeros(1, 80, 0), "source": torch.zeros(1, 1, 0),
                 "speech": torch.zeros(1, 0)}  # fmt: skip
        return {name: cache.clone() for name, cache in flow.items()}, empty


@pytest.fixture(scope="module")
def vocoder() -> SmallVocoder:
    return SmallVocoder()


@pytest.fixture(autouse=True)
def quiet_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiFT's excitation draws random phases and noise per row; drawn as
    zeros here, so that a stream's audio depends on its tokens alone."""
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.zeros(*shape, **kw))
    monkeypatch.setattr(torch, "randn_like", lambda like, **kw: torch.zeros_like(like, **kw))


def tokens(seed: int, count: int) -> list[int]:
    return torch.randint(0, 4000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_chunk_makes_what_the_packages_own_flow_makes(vocoder: SmallVocoder):
    runner = FlowRunner(vocoder, graphs=False)
    state = runner.open("voice-a.wav")
    flow, blocks = vocoder.flow, len(vocoder.flow.decoder.estimator.blocks)
    for chunk in range(4):  # the caches reach the prompt plus 100 frames and are cut back
        token = torch.tensor([tokens(chunk, VOCODER_CHUNK + runner.lookahead)])
        with torch.inference_mode():
            mel, caches = runner.flow_batch([state], token, last=False)
            want_mel, want = flow.inference_chunk(
                token=token, spk=state.speaker, cache=dict(state.flow), n_timesteps=STEPS
            )
        torch.testing.assert_close(mel, want_mel, atol=1e-5, rtol=1e-4)
        for name, cache in caches[0].items():
            expected = want[name]
            if name.startswith("estimator"):
                expected = expected[:STEPS, :blocks]
            dim = {"estimator_att_cache": 4, "conformer_att_cache": 3}.get(name)
            if dim is not None and expected.shape[dim] > state.prompt_frames + PROMPT_TAIL_FRAMES:
                head = expected.narrow(dim, 0, state.prompt_frames)
                tail = expected.narrow(dim, expected.shape[dim] - PROMPT_TAIL_FRAMES,
                                       PROMPT_TAIL_FRAMES)  # fmt: skip
                expected = torch.cat([head, tail], dim)
            torch.testing.assert_close(cache, expected, atol=1e-5, rtol=1e-4, msg=name)
        assert caches[0]["estimator_att_cache"].shape[4] <= (
            state.prompt_frames + PROMPT_TAIL_FRAMES + 2 * VOCODER_CHUNK
        )
        state = FlowState(state.speaker, state.prompt_frames, caches[0], state.mel,
                          state.source, state.speech)  # fmt: skip


def test_sessions_voiced_together_sound_as_each_alone(vocoder: SmallVocoder):
    """Three streams (two of one voice, one of another) pushed together for
    six rounds, one of them ending its turn on the third: every push's
    audio as the stream alone makes it. The two of one voice share a flow
    batch while they are as far into their turns (rounds 0 to 2, and 5,
    once the restarted stream's caches are cut back to the other's length);
    the other voice runs apart."""
    prompts = ["voice-a.wav", "voice-a.wav", "voice-bb.wav"]
    pushes = [[(tokens(10 * s + k, VOCODER_CHUNK), s == 1 and k == 2, k == 0) for k in range(6)]
              for s in range(3)]  # fmt: skip

    alone_runner = FlowRunner(vocoder, graphs=False)
    alone = []
    for prompt, script in zip(prompts, pushes, strict=True):
        stream = VoiceStream(alone_runner, prompt)
        alone.append([stream.push(chunk, last, flush) for chunk, last, flush in script])
    assert set(alone_runner.batch_sizes) == {1}

    runner = FlowRunner(vocoder, graphs=False)
    streams = [VoiceStream(runner, prompt) for prompt in prompts]
    together: list[list[np.ndarray | None]] = [[] for _ in streams]
    for k in range(6):
        made = voice_together(runner, [(stream, *pushes[s][k]) for s, stream in
                                       enumerate(streams)])  # fmt: skip
        for s, audio in enumerate(made):
            together[s].append(audio)

    assert runner.batch_sizes[2] == 4
    assert sum(audio is not None for audio in alone[0]) == 6
    for mine, theirs in zip(together, alone, strict=True):
        for audio, want in zip(mine, theirs, strict=True):
            assert (audio is None) == (want is None)
            if want is not None:
                assert audio.shape == want.shape and np.abs(want).max() > 1e-4
                np.testing.assert_allclose(audio, want, atol=2e-5)


def test_pushes_of_one_stream_are_refused_together(vocoder: SmallVocoder):
    runner = FlowRunner(vocoder, graphs=False)
    stream = VoiceStream(runner, "voice-a.wav")
    with pytest.raises(ValueError, match="one after another"):
        voice_together(runner, [(stream, tokens(1, 25), False, False)] * 2)


def test_the_model_codes_own_stream_through_the_pure_blocks_makes_the_same(vocoder: SmallVocoder):
    """graph_model_code_flow (without graphs on the CPU: the function a graph
    replays) under the package's own inference_chunk: the same mel and the
    same caches, chunk after chunk, as the package's own blocks."""
    runner = FlowRunner(vocoder, graphs=False)
    state = runner.open("voice-b.wav")
    estimator = vocoder.flow.decoder.estimator
    own = estimator.blocks_forward_chunk
    runs = []
    for graphed in (False, True):
        if graphed:
            assert graph_model_code_flow(vocoder, graphs=False)
            assert not graph_model_code_flow(vocoder, graphs=False)  # installed once
        cache, made = dict(state.flow), []
        for chunk in range(3):
            token = torch.tensor([tokens(10 + chunk, VOCODER_CHUNK + runner.lookahead)])
            with torch.inference_mode():
                mel, cache = vocoder.flow.inference_chunk(
                    token=token, spk=state.speaker, cache=cache, n_timesteps=STEPS
                )
            cache = {name: value.clone() for name, value in cache.items()}
            made.append((mel.clone(), cache))
        runs.append(made)
    estimator.blocks_forward_chunk = own
    for (mel, cache), (want_mel, want) in zip(runs[1], runs[0], strict=True):
        torch.testing.assert_close(mel, want_mel, atol=1e-6, rtol=1e-5)
        for name, value in want.items():
            torch.testing.assert_close(cache[name], value, atol=1e-6, rtol=1e-5)


def test_the_warm_up_voices_answers_together_at_every_batch_size(vocoder: SmallVocoder):
    """What the engine's warm-up runs on CUDA (warm_answer_voices): every
    batch size given, each twice (a graphed shape runs eagerly, then is
    captured), each push of an answer's start one batched chunk."""
    from omnilive.engines.minicpmo.sessions.simplex.speech import warm_answer_voices

    runner = FlowRunner(vocoder, graphs=False)
    base = runner.open("voice-a.wav")
    opened: list[bool] = []

    def open_voice(samples: np.ndarray, whole_seconds: bool) -> VoiceStream:
        opened.append(whole_seconds)
        return VoiceStream(runner, base=base, whole_seconds=whole_seconds)

    shared = types.SimpleNamespace(voice_runner=lambda: runner, open_voice=open_voice)
    calls = warm_answer_voices(shared, np.zeros(16_000, np.float32), (1, 2), 1)  # type: ignore[arg-type]
    assert calls == 2 * 2 * 3  # two sizes, twice, a first piece + a second + the end
    assert runner.batch_sizes == {1: 6, 2: 6}
    assert opened == [False] * (1 + 1 + 2 + 2)  # an answer's streams, not whole seconds


def test_kept_frequencies_embed_as_the_package() -> None:
    """The timestep embedder with its frequencies kept (no copy a flow step)
    makes the package's embeddings exactly, odd widths too."""
    dit = package("cosyvoice2.flow.decoder_dit")
    torch.manual_seed(1)
    embedder = dit.TimestepEmbedder(32, frequency_embedding_size=16)
    t = torch.rand(6)
    for dim in (16, 15):
        want = dit.TimestepEmbedder.timestep_embedding(t * 1000, dim)
        keep_frequencies(embedder)
        keep_frequencies(embedder)  # once is enough: a second call keeps the first
        assert torch.equal(embedder.timestep_embedding(t * 1000, dim), want)
    assert torch.equal(
        embedder(t), embedder.mlp(dit.TimestepEmbedder.timestep_embedding(t * 1000, 16))
    )
