"""The step graphs' static KV-cache mirror against transformers' own eager
path, on the CPU with tiny real transformers models.

CUDA graphs need a GPU (benchmarks/gpu_steps.py measures them there); here
:class:`StepGraphs` runs each step's static-cache forward without capturing
it, which is the part omnilive writes: the buffers mirroring the caller's
``DynamicCache``, the copies back after the model code changed it, the
growth of the buffers, and the three hooks into the model's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaModel, Qwen3Config, Qwen3ForCausalLM

from omnilive.engines.minicpmo.reference.graphs import (
    StepGraphs,
    install_backbone_graphs,
    install_causal_lm_graphs,
    install_decoder_graphs,
)

HIDDEN = 64
CLOSE = {"atol": 1e-5, "rtol": 1e-4}


def tiny_llm(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = Qwen3Config(
        hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=96, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config).eval()


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))


class Decoder:
    """What the duplex decoder's ``feed`` does: the LLM over a DynamicCache,
    positions from the cache length, the last hidden states and their logits."""

    def __init__(self, llm: Any) -> None:
        self.m = llm
        self.cache: Any = None

    def get_cache_length(self) -> int:
        return 0 if self.cache is None else int(self.cache.key_cache[0].shape[2])

    @torch.no_grad()
    def feed(self, embeds: torch.Tensor, return_logits: bool = False) -> Any:
        past = self.get_cache_length()
        positions = torch.arange(past, past + embeds.shape[0]).unsqueeze(0)
        out = self.m(inputs_embeds=embeds.unsqueeze(0), position_ids=positions,
                     past_key_values=self.cache, return_dict=True,
                     output_hidden_states=True)  # fmt: skip
        self.cache = out.past_key_values
        if return_logits:
            return self.m.lm_head(out.hidden_states[-1])[:, -1], out.hidden_states[-1]
        return None


def cut_and_rebuild(decoder: Decoder) -> None:
    """Drop the last two positions, then rebuild every layer from two slices,
    as the model's sliding window does."""
    cache = decoder.cache
    cache.crop(decoder.get_cache_length() - 2)
    cache.key_cache = [torch.cat([k[:, :, :4], k[:, :, 7:]], 2) for k in cache.key_cache]
    cache.value_cache = [torch.cat([v[:, :, :4], v[:, :, 7:]], 2) for v in cache.value_cache]


def duplex_script() -> list[tuple[str, Any]]:
    steps: list[tuple[str, Any]] = [("feed", rows(20, 0))]
    for unit in range(8):
        steps.append(("feed", rows(3, 100 + unit)))  # the unit's audio
        steps += [("feed", rows(1, 200 + 10 * unit + k)) for k in range(2 if unit % 2 else 0)]
        steps.append(("feed", rows(2, 300 + unit)))  # the unit's end
        if unit == 4:
            steps.append(("reshape", None))
    return steps


def test_duplex_steps_match_the_eager_decoder():
    llm = tiny_llm()
    graphs = StepGraphs(llm.model, llm.lm_head, initial_capacity=32, capture=False)
    eager, graphed = Decoder(llm), Decoder(llm)
    install_decoder_graphs(graphed, graphs)
    for kind, embeds in duplex_script():
        if kind == "reshape":
            cut_and_rebuild(eager)
            cut_and_rebuild(graphed)
            continue
        want_logits, want_hidden = eager.feed(embeds, return_logits=True)
        logits, hidden = graphed.feed(embeds, return_logits=True)
        torch.testing.assert_close(logits, want_logits, **CLOSE)
        torch.testing.assert_close(hidden, want_hidden, **CLOSE)
    mine = graphed.cache.key_cache + graphed.cache.value_cache
    theirs = eager.cache.key_cache + eager.cache.value_cache
    for layer, want in zip(mine, theirs, strict=True):
        torch.testing.assert_close(layer, want, **CLOSE)
    stats = graphs.stats()
    # 24 steps after the prompt (which has no cache to mirror yet); the first
    # use of each length (3, 1 and 2 positions) runs eagerly, the rest mirrored.
    assert stats["replays"] == 21 and stats["graphs"] == 3
    # Copied in after the eager steps and after the rebuild; grown from 32.
    assert stats["syncs"] >= 2 and stats["capacity"] >= 64
    # Between steps the model's cache is a view of the buffers, not a copy.
    assert graphed.cache.key_cache[0].data_ptr() == graphs.cache.key_cache[0].data_ptr()
    assert graphed.feed(rows(1, 999)) is None  # return_logits=False answers nothing, as feed does


def chat_steps(llm: Any, n: int, run: Callable[[], Any] = torch.no_grad) -> list[Any]:
    """The simplex views' chunked generation: the LLM called with its cache."""
    cache, seen = None, []
    with run():
        for k, embeds in enumerate([rows(10, 1), *[rows(1, 50 + k) for k in range(n)]]):
            out = llm(inputs_embeds=embeds.unsqueeze(0), past_key_values=cache, use_cache=True,
                      output_hidden_states=True)  # fmt: skip
            cache = out.past_key_values
            seen.append((k, out.logits[:, -1].clone(), out.hidden_states[-1][:, -1].clone()))
    return seen


def test_chat_steps_match_the_model():
    llm = tiny_llm(1)
    graphs = StepGraphs(llm.model, llm.lm_head, initial_capacity=16, capture=False)
    install_causal_lm_graphs(llm, graphs)
    graphs.active = False
    want = chat_steps(llm, 12)
    assert graphs.replays == 0  # inactive: the model's own forward throughout
    graphs.active = True
    got = chat_steps(llm, 12)
    for (_, logits, hidden), (_, want_logits, want_hidden) in zip(got, want, strict=True):
        torch.testing.assert_close(logits, want_logits, **CLOSE)
        torch.testing.assert_close(hidden, want_hidden, **CLOSE)
    assert graphs.replays == 11 and graphs.capacity == 32  # grew past 16 on the way


def test_speech_lm_steps_keep_their_own_positions():
    torch.manual_seed(2)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=64)  # fmt: skip
    speech_lm = LlamaModel(config).eval()
    graphs = StepGraphs(speech_lm, name="tts", max_tokens=1, initial_capacity=16, capture=False)
    install_backbone_graphs(speech_lm, graphs)

    def steps() -> list[torch.Tensor]:
        # The speech LM's positions run ahead of its cache (text_start_pos + ...).
        start, cache, out = 7, None, []
        with torch.no_grad():
            for embeds in [rows(5, 3), *[rows(1, 60 + k) for k in range(6)]]:
                length = embeds.shape[0]
                offset = 0 if cache is None else int(cache.key_cache[0].shape[2])
                positions = torch.arange(start + offset, start + offset + length).unsqueeze(0)
                result = speech_lm(position_ids=positions, past_key_values=cache,
                                   inputs_embeds=embeds.unsqueeze(0), use_cache=True,
                                   output_attentions=False)  # fmt: skip
                cache = result.past_key_values
                out.append(result.last_hidden_state[:, -1].clone())
        return out

    graphs.active = False
    want = steps()
    graphs.active = True
    got = steps()
    for mine, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(mine, theirs, **CLOSE)
    assert graphs.replays == 5  # the one-position steps after the first


def test_buffers_made_in_inference_mode_take_later_steps_under_no_grad():
    """The simplex views run in inference mode, the duplex one under no_grad:
    buffers allocated in the first must still be writable in the second."""
    llm = tiny_llm(3)
    graphs = StepGraphs(llm.model, llm.lm_head, initial_capacity=64, capture=False)
    install_causal_lm_graphs(llm, graphs)
    chat_steps(llm, 4, run=torch.inference_mode)
    assert graphs.replays > 0 and not graphs.cache.key_cache[0].is_inference()
    decoder = Decoder(llm)
    install_decoder_graphs(decoder, graphs)
    for embeds in [rows(8, 4), rows(1, 5), rows(1, 6), rows(1, 7)]:
        decoder.feed(embeds, return_logits=True)  # copies into the buffers: no error
    assert graphs.syncs >= 2


def test_no_autograd_history_outlives_a_step():
    """Weights require grad and a caller may leave grad mode on: the inputs
    copied into the static buffers must not chain every step's history."""
    llm = tiny_llm(4)
    graphs = StepGraphs(llm.model, llm.lm_head, initial_capacity=64, capture=False)
    install_causal_lm_graphs(llm, graphs)
    assert next(llm.parameters()).requires_grad
    seen = chat_steps(llm, 6, run=torch.enable_grad)
    assert graphs.replays > 0
    for graph in graphs.graphs.values():
        assert graph.embeds.grad_fn is None and not graph.embeds.requires_grad
    # The prompt and the first one-position step ran the model's own code (with
    # grad, as the caller asked); the mirrored ones return plain tensors.
    assert seen[1][1].requires_grad
    assert all(not logits.requires_grad for _, logits, _ in seen[2:])


@pytest.mark.parametrize("length", [0, 129])
def test_steps_the_mirror_does_not_model_run_eagerly(length: int):
    llm = tiny_llm(5)
    graphs = StepGraphs(llm.model, llm.lm_head, max_tokens=128, capture=False)
    decoder = Decoder(llm)
    install_decoder_graphs(decoder, graphs)
    if length:  # longer than max_tokens, after a cache exists
        decoder.feed(rows(4, 8))
        decoder.feed(rows(length, 9))
        decoder.feed(rows(length, 10))
    else:  # no cache yet (the system prompt), twice
        decoder.feed(rows(4, 8))
        decoder.cache = None
        decoder.feed(rows(4, 8))
    assert graphs.replays == 0 and graphs.fallbacks == 3 - (length == 0)


def test_a_turn_cut_back_by_crop_goes_on_from_the_kept_context():
    """Half-duplex rolls a failed or speculative turn back by cropping the
    cache (host.restore, the model's speculative snapshot); the mirrored
    steps after it must see only what was kept."""
    llm = tiny_llm(6)
    graphs = StepGraphs(llm.model, llm.lm_head, initial_capacity=64, capture=False)
    install_causal_lm_graphs(llm, graphs)

    def turn(cache: Any, seed: int, n: int = 5) -> tuple[Any, list[torch.Tensor]]:
        seen = []
        with torch.no_grad():
            for k in range(n):
                out = llm(inputs_embeds=rows(1, seed + k).unsqueeze(0), past_key_values=cache,
                          use_cache=True)  # fmt: skip
                cache = out.past_key_values
                seen.append(out.logits[:, -1].clone())
        return cache, seen

    def session(active: bool) -> list[torch.Tensor]:
        graphs.active = active
        with torch.no_grad():
            cache = llm(inputs_embeds=rows(12, 7).unsqueeze(0), use_cache=True).past_key_values
        kept = int(cache.key_cache[0].shape[2])
        cache, _ = turn(cache, 100)  # the turn that is rolled back
        cache.crop(kept)
        _, seen = turn(cache, 200)  # the turn that counts
        return seen

    want = session(active=False)
    got = session(active=True)
    for mine, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(mine, theirs, **CLOSE)
    assert graphs.replays >= 8
