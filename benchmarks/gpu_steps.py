"""The duplex decoder's LLM steps on a GPU: eager ``feed`` against omnilive's
CUDA-graph steps (``omnilive.engines.minicpmo.reference.graphs``), on the same inputs.

``--code DIR`` holds the model's public code (the ``MiniCPMO45`` files); its
``StreamDecoder`` runs over a Qwen3 LLM of the real MiniCPM-o 4.5 size
(Qwen3-8B: 36 layers, hidden 4096) with random bf16 weights. One scripted
session is played twice, eagerly and through the graphs, with identical
embeddings: a system prompt, then per unit an audio prefill of 13 positions
(an omni unit: 78), up to 8 one-token speak steps and a 2-token unit end. Half
way, the cache is cut back (``crop``) and rebuilt from slices, as the model's
sliding window does, so the mirror's copy path runs too.

The simplex views' generation (the LLM called once per token with its
cache, as the model's ``ChunkPrefillChunkGenerate`` does) is played the same
way, eagerly and through the graphs.

Reports milliseconds per step kind (median, p95) for both, and how far each
one's logits are from the same weights run in float32 (largest difference,
greedy-token agreement); saves them under
``benchmarks/results/gpu_steps_<gpu>.json``. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

STEP_KINDS = ("prefill", "token", "unit_end")


def build_llm(device: str, layers: int) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        llm = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    return llm


def script(units: int, unit_positions: int, seed: int = 1) -> list[tuple[str, Any]]:
    """The session's feeds: (kind, embedding rows), the same for both runs."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    steps: list[tuple[str, Any]] = [("system", torch.randn(300, 4096, generator=generator))]
    for unit in range(units):
        steps.append(("prefill", torch.randn(unit_positions, 4096, generator=generator)))
        for _ in range(8 if unit % 2 else 0):  # every other unit speaks
            steps.append(("token", torch.randn(1, 4096, generator=generator)))
        steps.append(("unit_end", torch.randn(2, 4096, generator=generator)))
        if unit == units // 2:
            steps.append(("reshape", None))
    return steps


def reshape(decoder: Any) -> None:
    """Crop the last unit end, then rebuild every layer from two slices (the
    way the model's sliding window drops old units)."""
    import torch

    cache = decoder.cache
    cache.crop(decoder.get_cache_length() - 2)
    cut = 100
    cache.key_cache = [torch.cat([k[:, :, :cut], k[:, :, cut + 10 :]], 2) for k in cache.key_cache]
    cache.value_cache = [
        torch.cat([v[:, :, :cut], v[:, :, cut + 10 :]], 2) for v in cache.value_cache
    ]


def play(decoder: Any, steps: list[tuple[str, Any]], scale: float) -> dict[str, Any]:
    import torch

    times: dict[str, list[float]] = {kind: [] for kind in STEP_KINDS}
    logits_seen: list[Any] = []
    device = decoder.m.device
    for kind, rows in steps:
        if kind == "reshape":
            reshape(decoder)
            continue
        embeds = (rows * scale).to(device=device, dtype=decoder.m.dtype)
        torch.cuda.synchronize()
        started = time.perf_counter()
        logits, _hidden = decoder.feed(embeds, return_logits=True)
        torch.cuda.synchronize()
        if kind in times:
            times[kind].append((time.perf_counter() - started) * 1000)
        logits_seen.append(logits.float().cpu())
    return {"times": times, "logits": logits_seen, "kv": decoder.get_cache_length()}


def compare(logits: list[Any], reference: list[Any]) -> dict[str, float]:
    """How far bf16 logits are from the float32 reference: the largest
    difference, relative to the largest logit, and greedy-token agreement."""
    pairs = list(zip(logits, reference, strict=True))
    worst = max(float((a - b).abs().max()) for a, b in pairs)
    scale = max(float(b.abs().max()) for _, b in pairs)
    agree = sum(bool(a.argmax() == b.argmax()) for a, b in pairs) / len(pairs)
    return {"max_diff": round(worst, 4), "max_abs": round(scale, 2),
            "greedy_agreement": round(agree, 4)}  # fmt: skip


def chat_script(tokens: int, seed: int = 3) -> list[tuple[str, Any]]:
    """A chat answer as the model's chunked generation runs it: the prompt,
    the assistant's opening tokens (5), then one token at a time."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    steps: list[tuple[str, Any]] = [
        ("system", torch.randn(300, 4096, generator=generator)),
        ("prefill", torch.randn(5, 4096, generator=generator)),
    ]
    steps += [("token", torch.randn(1, 4096, generator=generator)) for _ in range(tokens)]
    return steps


def play_chat(llm: Any, steps: list[tuple[str, Any]], scale: float) -> dict[str, Any]:
    """The steps through ``llm(inputs_embeds=..., past_key_values=...)``, the
    call of the model's ``ChunkPrefillChunkGenerate``."""
    import torch

    times: dict[str, list[float]] = {kind: [] for kind in STEP_KINDS}
    logits_seen: list[Any] = []
    cache = None
    for kind, rows in steps:
        embeds = (rows * scale).to(device=llm.device, dtype=llm.dtype).unsqueeze(0)
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad():
            out = llm(inputs_embeds=embeds, past_key_values=cache, use_cache=True,
                      output_hidden_states=True)  # fmt: skip
        torch.cuda.synchronize()
        if kind in times:
            times[kind].append((time.perf_counter() - started) * 1000)
        cache = out.past_key_values
        logits_seen.append(out.logits[:, -1].float().cpu())
    return {"times": times, "logits": logits_seen}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(values), "median": round(statistics.median(ordered), 2),
            "p95": round(p95, 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", type=Path, required=True, help="the MiniCPMO45 code folder")
    parser.add_argument("--units", type=int, default=24)
    parser.add_argument("--omni", action="store_true", help="78 positions per unit, not 13")
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from omnilive.engines.minicpmo.reference.graphs import (
        StepGraphs,
        install_causal_lm_graphs,
        install_decoder_graphs,
    )

    sys.path.insert(0, str(args.code))
    from utils import StreamDecoder  # the model's own decoder

    tokenizer = AutoTokenizer.from_pretrained(str(args.code), trust_remote_code=True)
    llm = build_llm("cuda", args.layers)
    steps = script(args.units, 78 if args.omni else 13)
    # Random embeddings at the scale of the model's own (its embedding table).
    scale = float(llm.model.embed_tokens.weight.float().std())

    # The ground truth both are held to: the same weights in float32, eagerly
    # (copied before any hook goes onto the model).
    reference_llm = copy.deepcopy(llm).float()
    reference = play(StreamDecoder(reference_llm, tokenizer), steps, scale)["logits"]
    chat_steps = chat_script(40)
    chat_reference = play_chat(reference_llm, chat_steps, scale)["logits"]
    del reference_llm
    torch.cuda.empty_cache()

    eager = play(StreamDecoder(llm, tokenizer), steps, scale)
    graphs = StepGraphs(llm.model, llm.lm_head)
    graphed_decoder = StreamDecoder(llm, tokenizer)
    install_decoder_graphs(graphed_decoder, graphs)
    # Capture every step length outside the timed run.
    play(graphed_decoder, script(2, 78 if args.omni else 13, seed=2), scale)
    graphed_decoder = StreamDecoder(llm, tokenizer)
    install_decoder_graphs(graphed_decoder, graphs)
    graphed = play(graphed_decoder, steps, scale)

    # The simplex views' chunked generation calls the LLM itself.
    install_causal_lm_graphs(llm, graphs)
    graphs.active = False
    chat_eager = play_chat(llm, chat_steps, scale)
    graphs.active = True
    play_chat(llm, chat_script(3, seed=4), scale)  # capture outside the timed run
    chat_graphed = play_chat(llm, chat_steps, scale)
    errors = {
        "eager": compare(eager["logits"], reference),
        "graphs": compare(graphed["logits"], reference),
        "chat_eager": compare(chat_eager["logits"], chat_reference),
        "chat_graphs": compare(chat_graphed["logits"], chat_reference),
    }
    name = torch.cuda.get_device_name().lower().replace(" ", "_")
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "layers": args.layers,
        "positions_per_unit": 78 if args.omni else 13,
        "units": args.units,
        "kv_final": [eager["kv"], graphed["kv"]],
        "eager_ms": {kind: summary(v) for kind, v in eager["times"].items() if v},
        "graphs_ms": {kind: summary(v) for kind, v in graphed["times"].items() if v},
        "chat_eager_ms": {kind: summary(v) for kind, v in chat_eager["times"].items() if v},
        "chat_graphs_ms": {kind: summary(v) for kind, v in chat_graphed["times"].items() if v},
        "vs_float32": errors,
        "graph_stats": graphs.stats(),
    }
    print(json.dumps(report, indent=2))
    suffix = "_omni" if args.omni else ""
    out = args.out or Path(__file__).parent / "results" / f"gpu_steps_{name}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
