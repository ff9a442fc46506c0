"""The fused forward of the batched steps (fused_decoder.py, kernels.py)
against transformers' own, each session alone, on the CPU with tiny real
Qwen3 (query/key norms) and Llama (the speech LM's kind) models; the Triton
kernels run in Triton's interpreter (tests/conftest.py), each also held to
a float64 reference of its own function."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from omnilive.engines.minicpmo.runtime import kernels
from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, SlotCache
from omnilive.engines.minicpmo.runtime.fused_decoder import FusedDecoder, fuse_rows, unsupported
from omnilive.engines.minicpmo.runtime.graphs import GraphCache
from omnilive.engines.minicpmo.sessions.shared import fused_decoder
from tests.minicpmo.test_batch import TIGHT, VOCAB, play_alone, play_batched, script
from tests.minicpmo.test_graphs import tiny_llm

needs_triton = pytest.mark.skipif(not kernels.AVAILABLE, reason="Triton is not installed")
# Where the kernels run: compiled on a GPU machine, interpreted elsewhere.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tiny_llama(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


class _Graphed:
    """A GraphCache with the cache attribute play_batched reads."""

    def __init__(self, graphs: GraphCache) -> None:
        self.graphs, self.cache = graphs, graphs.steps.cache

    def step(self, requests: list) -> list:
        return self.graphs.step(requests)


def fused_steps(llm: Any, slots: int, *, use_kernels: bool, graphs: bool = False) -> Any:
    cache = SlotCache(llm.config, slots, 128, bucket=16)
    decoder = FusedDecoder(llm.model, use_kernels=use_kernels)
    steps = BatchedSteps(llm.model, cache, llm.lm_head, decoder=decoder)
    # The simulated graphs: padded plans, prefixes and gathers, as on a GPU.
    return _Graphed(GraphCache(steps, capture=False)) if graphs else steps


# The torch path plain; the kernels (slow in the interpreter: fewer, shorter
# sessions) through the graphs' padded plans.
TORCH_PATH = ([(1, 5, 0, None), (2, 6, 0, 20), (3, 4, 2, None), (4, 4, 4, None)], 3, False)
KERNELS = ([(5, 2, 0, None), (6, 3, 0, 12), (7, 2, 1, None)], 2, True)


@pytest.mark.parametrize("make", [tiny_llm, tiny_llama], ids=["qwen3", "llama"])
@pytest.mark.parametrize(
    ("scripts", "slots", "use_kernels"),
    [TORCH_PATH, pytest.param(*KERNELS, marks=needs_triton)],
    ids=["torch path", "kernels through graphs"],
)
def test_the_fused_forward_matches_each_session_alone(
    make: Any, scripts: list, slots: int, use_kernels: bool
):
    llm = make(slots)
    sessions = [script(seed, units=units, start=start, leave_after=leave)
                for seed, units, start, leave in scripts]  # fmt: skip
    wanted = [list(play_alone(llm, session)) for session in sessions]
    steps = fused_steps(llm, slots=slots, use_kernels=use_kernels, graphs=use_kernels)
    play_batched(steps, sessions, seed=slots)
    for session, want in zip(sessions, wanted, strict=True):
        assert [token for token, _, _ in session.seen] == [token for token, _, _ in want]
        for (_, hidden, logits), (_, want_hidden, want_logits) in zip(
            session.seen, want, strict=True
        ):
            torch.testing.assert_close(logits, want_logits, **TIGHT)
            torch.testing.assert_close(hidden, want_hidden, **TIGHT)
    if use_kernels:
        assert steps.graphs.captures > 1  # several bucket shapes went through the kernels


@pytest.mark.parametrize(
    "use_kernels", [pytest.param(True, marks=needs_triton), False], ids=["kernels", "torch path"]
)
def test_a_decoding_steps_graph_serves_every_context_length(use_kernels: bool):
    """A long call's contexts cross width buckets; through the kernel (which
    reads each row's own columns at any width) its decoding steps replay one
    graph at every length, captured once, not one more per bucket reached
    while the sessions wait. The torch path reads the width it is given:
    one graph per bucket."""
    llm = tiny_llm(2)
    graphed = fused_steps(llm, slots=2, use_kernels=use_kernels, graphs=True)
    graphs, cache = graphed.graphs, graphed.cache
    slot = cache.acquire()
    graphs.step([(slot, torch.zeros(1, dtype=torch.long))])
    first = graphs.captures
    for held in (20, 40, 70, 100):  # widths 32, 48, 80, 112 of buckets of 16
        cache.lengths[slot] = held
        graphs.step([(slot, torch.zeros(1, dtype=torch.long))])
    assert graphs.captures - first == (0 if use_kernels else 4)


@needs_triton
@pytest.mark.parametrize(("group", "length"), [(4, 1), (2, 3), (1, 8)])
def test_decode_attention_reads_each_rows_own_columns(group: int, length: int):
    """Against float64 softmax attention over each row's slot, the rows on
    any slots (two rows on neighbouring slots, one on a slot read by no
    other, an empty-like row seeing column 0 only), several splits."""
    torch.manual_seed(group * 10 + length)
    kv_heads, dim, slots, columns = 2, 16, 5, 400
    keys = torch.randn(slots, kv_heads, columns, dim, device=DEVICE)
    values = torch.randn(slots, kv_heads, columns, dim, device=DEVICE)
    rows = torch.tensor([3, 0, 4, 1], device=DEVICE)
    held = torch.tensor([250, 17, 0, 64], device=DEVICE)  # a row's columns before its new ones
    limit = held[:, None] + torch.arange(length, device=DEVICE)[None, :]
    q = torch.randn(4 * length, kv_heads * group, dim, device=DEVICE)
    out = kernels.decode_attention(q, (keys, values), rows, limit, 0.3, width=320).cpu()
    keys, values, rows, limit, q = (t.cpu() for t in (keys, values, rows, limit, q))
    for b in range(4):
        for i in range(length):
            for h in range(kv_heads * group):
                seen = int(limit[b, i]) + 1
                k = keys[rows[b], h // group, :seen].double()
                v = values[rows[b], h // group, :seen].double()
                weights = torch.softmax(k @ q[b * length + i, h].double() * 0.3, dim=0)
                want = weights @ v
                got = out[b * length + i, h].double()
                torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@needs_triton
def test_the_kernels_stay_within_bfloat16_noise_of_the_models_modules():
    """bfloat16, a prefill and a decoding step: the kernels' hidden states
    and cached keys/values against the same forward in float64, no further
    off than the torch path (the model's own modules) in bfloat16 is, by
    relative error (bf16 arithmetic lands between 1e-3 and 1e-2; the
    interpreter rounds bf16 its own way, hence the margin)."""

    def run(dtype: torch.dtype, use_kernels: bool) -> list[torch.Tensor]:
        llm = tiny_llm(3).to(DEVICE, dtype)
        cache = SlotCache(llm.config, 2, 64, bucket=16, device=DEVICE, dtype=dtype)
        decoder = FusedDecoder(llm.model, use_kernels=use_kernels)
        steps = BatchedSteps(llm.model, cache, llm.lm_head, decoder=decoder)
        a, b = cache.acquire(), cache.acquire()
        gen = torch.Generator().manual_seed(9)
        steps.step([(a, torch.randint(VOCAB, (11,), generator=gen)),
                    (b, torch.randint(VOCAB, (7,), generator=gen))])  # fmt: skip
        out = steps.step([(a, torch.tensor([5])), (b, torch.tensor([8]))])
        kept = [buffer[:2, :, :12] for buffer in cache.key_cache + cache.value_cache]
        return [tensor.double().cpu() for tensor in [r.hidden for r in out] + kept]

    def relative(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got - want).norm() / want.norm())

    exact = run(torch.float64, use_kernels=False)
    plain = run(torch.bfloat16, use_kernels=False)
    fused = run(torch.bfloat16, use_kernels=True)
    for got, usual, want in zip(fused, plain, exact, strict=True):
        assert relative(got, want) < 2e-2
        assert relative(got, want) <= 2 * relative(usual, want) + 1e-3


def test_fused_weights_are_views_of_one_tensor():
    llm = tiny_llm(4)
    attention = llm.model.layers[0].self_attn
    before = [p.detach().clone() for p in (attention.q_proj.weight, attention.v_proj.weight)]
    fused = fuse_rows([attention.q_proj, attention.k_proj, attention.v_proj])
    assert torch.equal(attention.q_proj.weight, before[0])
    assert torch.equal(attention.v_proj.weight, before[1])
    storage = fused.untyped_storage().data_ptr()
    assert attention.v_proj.weight.untyped_storage().data_ptr() == storage
    rows = attention.q_proj.out_features + 2 * attention.k_proj.out_features
    assert fused.shape == (rows, attention.q_proj.in_features)


def test_an_unsupported_decoder_keeps_the_stock_forward():
    config = Qwen3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, use_sliding_window=True, sliding_window=8,
        max_window_layers=1,
    )  # fmt: skip
    llm = Qwen3ForCausalLM(config).eval()
    assert unsupported(llm.model) == "sliding-window attention"
    assert fused_decoder(llm.model) is None
    gelu = tiny_llm(5)
    gelu.model.config.hidden_act = "gelu"
    assert "activation" in str(unsupported(gelu.model))
    with pytest.raises(ValueError, match="does not run"):
        FusedDecoder(gelu.model, use_kernels=False)
