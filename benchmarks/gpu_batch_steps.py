"""Batched LLM steps of many sessions on one GPU: per-slot KV memory and one
forward over all slots (``omnilive.engines.minicpmo.runtime.batch``).

A Qwen3 decoder of the MiniCPM-o 4.5 LLM's size (Qwen3-8B: 36 layers, hidden
4096, GQA 32/8, head_dim 128, vocab 151936) with random bf16 weights holds N
sessions (N = 1, 2, 4, 8, 12, 16) in slots of 4,096 positions, each with 2,048
cached. Timed, per N: a decode step (one new token per slot) and a
13-position prefill (an audio unit's), replayed from one CUDA graph per N,
step length and width bucket, for each attention:

- ``slots``: ``slot_attention`` (query heads folded onto their K/V head, no
  K/V copy) over the step's width bucket (2,560 columns here): the default;
- ``gqa``: ``gqa_slot_attention`` (SDPA's ``enable_gqa`` with the mask) over
  the same width;
- ``fused``: the engine's own forward (``fused_decoder``: fused products,
  Triton kernels for the norms, rotary, activation and a short step's
  attention, which reads only each row's own columns);
- ``stock``: the model's own sdpa (``repeat_kv`` and contiguous copies) over
  every column of the buffers, as the first version read them: the baseline.

Also eager steps of the default, how far each graph's logits are from an
eager step of the stock path on the same inputs, and which CUDA kernels one
eager step of each attention ran at the largest N (which SDPA backend torch
picked). Each slot is cropped back to its context after every step, so every
step reads the same amount of cache. Reports the median and p95 over the warm
steps; saves ``benchmarks/results/gpu_batch_steps_<gpu>.json``.

``--loop`` measures the serving path instead: N concurrent asyncio sessions
decode greedily in lockstep through one ``BatchLoop`` whose ticks replay the
graphs of a ``GraphCache`` (batch-size bucket, step length, width bucket);
reported per N: ms per tick as a session sees it (submit to result, the
hand-back included), the graphs captured and the batch sizes the loop formed.
Saves ``benchmarks/results/gpu_batch_loop_<gpu>.json``.

``--tiny`` runs a tiny configuration on the CPU (eager steps, no graphs, no
profile; with ``--loop``, simulated graphs): a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from omnilive.engines.minicpmo.runtime.attention import GQA_SLOT_ATTENTION, SLOT_ATTENTION
from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, SlotCache, StepRequest
from omnilive.engines.minicpmo.runtime.fused_decoder import FusedDecoder
from omnilive.engines.minicpmo.runtime.graphs import StepGraph
from omnilive.engines.minicpmo.runtime.loop import BatchLoop

QWEN3_8B = {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1e6,
}  # fmt: skip
TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96,
}  # fmt: skip
PREFILL = 13  # positions of an audio unit's prefill
KINDS = (("decode", 1), ("prefill13", PREFILL))
# name: (the attention BatchedSteps names, whether steps read every column)
ATTENTIONS = {"slots": (SLOT_ATTENTION, False), "gqa": (GQA_SLOT_ATTENTION, False),
              "fused": (SLOT_ATTENTION, False), "stock": (None, True)}  # fmt: skip


def build(shape: dict[str, Any], device: str, dtype: torch.dtype) -> Any:
    config = Qwen3Config(**shape, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen3ForCausalLM(config).to(dtype).eval().requires_grad_(False)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def fill(steps: BatchedSteps, context: int, chunk: int) -> None:
    """Every slot gets ``context`` positions, all slots prefilled together."""
    vocab = steps.backbone.config.vocab_size
    done = 0
    while done < context:
        size = min(chunk, context - done)
        steps.step([(slot, torch.randint(vocab, (size,))) for slot in range(steps.cache.slots)])
        done += size


def requests(steps: BatchedSteps, n: int, length: int, scale: float) -> list[StepRequest]:
    """A decode step feeds token ids; a prefill feeds embeddings, as the
    model's audio and vision encoders do."""
    config, device = steps.backbone.config, steps.device
    if length == 1:
        ids = torch.randint(config.vocab_size, (n, 1), device=device)
        return [StepRequest(slot, ids[slot]) for slot in range(n)]
    embeds = torch.randn(n, length, config.hidden_size, device=device, dtype=steps.dtype)
    return [StepRequest(slot, embeds[slot] * scale) for slot in range(n)]


def graph_step(steps: BatchedSteps, n: int, length: int, scale: float, width: int | None) -> Any:
    """A step of slots 0..n-1 and ``length`` new positions replayed from the
    engine's own :class:`StepGraph`, captured once over plan tensors of one
    width (``None``: the step's width bucket); returns the step function and
    the width."""
    first = requests(steps, n, length, scale)
    graph = StepGraph(steps, steps.plan(first, width=width), steps.embed(first), capture=True)

    def step(batch: list[StepRequest]) -> Any:
        plan = steps.plan(batch, width=graph.plan.width)
        _, logits = graph.replay(plan, steps.embed(batch))
        steps.cache.commit(plan)
        return logits

    return step, graph.plan.width


def eager_step(steps: BatchedSteps, batch: list[StepRequest]) -> Any:
    return torch.stack([result.logits for result in steps.step(batch)])


def crop(steps: BatchedSteps, n: int, context: int) -> None:
    for slot in range(n):
        steps.cache.crop(slot, context)


def timed(run: Any, steps: BatchedSteps, n: int, length: int, args: Any, scale: float) -> Any:
    """Milliseconds per step over the warm steps, each from the same context."""
    times = []
    for k in range(args.warmup + args.steps):
        batch = requests(steps, n, length, scale)
        sync(args.device)
        started = time.perf_counter()
        run(batch)
        sync(args.device)
        if k >= args.warmup:
            times.append((time.perf_counter() - started) * 1000)
        crop(steps, n, args.context)
    return summary(times)


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"median": round(statistics.median(ordered), 3), "p95": round(p95, 3)}


def vs_reference(run: Any, reference: BatchedSteps, n: int, length: int, args: Any,
                 scale: float) -> float:  # fmt: skip
    """Largest logit difference between ``run`` and an eager step of the
    stock attention, on the same inputs from the same context."""
    batch = requests(reference, n, length, scale)
    want = eager_step(reference, batch).float()
    crop(reference, n, args.context)
    got = run(batch).float()
    crop(reference, n, args.context)
    return float((got - want).abs().max())


def measure(variants: dict[str, BatchedSteps], n: int, length: int, args: Any,
            scale: float) -> dict[str, Any]:  # fmt: skip
    """One step kind at one N: the default's eager steps, then each attention."""
    default, reference = variants["slots"], variants["stock"]
    result: dict[str, Any] = {
        "eager_ms": timed(lambda b: eager_step(default, b), default, n, length, args, scale)
    }
    for name, steps in variants.items():
        full = ATTENTIONS[name][1]
        result[name] = attention(steps, reference, full, n, length, args, scale)
    return result


def attention(steps: BatchedSteps, reference: BatchedSteps, full: bool, n: int, length: int,
              args: Any, scale: float) -> dict[str, Any]:  # fmt: skip
    """On a GPU: the graph of the step over every column (``full``) or its
    width bucket, timed; on the CPU: an eager step, over the bucket, untimed."""
    if args.device != "cuda":
        width = steps.plan(requests(steps, n, length, scale)).width
        eager = vs_reference(lambda b: eager_step(steps, b), reference, n, length, args, scale)
        return {"width": width, "vs_reference": eager}
    started = time.perf_counter()
    step, width = graph_step(steps, n, length, scale, steps.cache.columns if full else None)
    return {
        "width": width,
        "capture_ms": round((time.perf_counter() - started) * 1000, 1),
        "graph_ms": timed(step, steps, n, length, args, scale),
        "vs_reference": vs_reference(step, reference, n, length, args, scale),
    }


def kernels(steps: BatchedSteps, n: int, length: int, args: Any, scale: float) -> list:
    """The CUDA kernels of one eager step, by device time (which SDPA kernel
    the attention got is among them): ``[name, ms]``."""
    batch = requests(steps, n, length, scale)
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        eager_step(steps, batch)
        sync(args.device)
    crop(steps, n, args.context)
    events = sorted(profile.key_averages(), key=lambda event: -event.self_device_time_total)
    return [[event.key[:160], round(event.self_device_time_total / 1000, 3)]
            for event in events[:40] if event.self_device_time_total > 0]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--slots", default="1,2,4,8,12,16")
    parser.add_argument("--context", type=int, help="cached positions per slot")
    parser.add_argument("--capacity", type=int, help="positions per slot (default: 2 x context)")
    parser.add_argument("--bucket", type=int, help="width bucket, columns (multiple of 16)")
    parser.add_argument("--attention", default=",".join(ATTENTIONS),
                        help=f"attentions to measure, of {', '.join(ATTENTIONS)}")  # fmt: skip
    parser.add_argument("--steps", type=int, help="timed steps per measure (>= 20)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--loop", action="store_true",
                        help="sessions decoding through BatchLoop with graphs")  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.device = "cpu" if args.tiny else "cuda"
    args.context = args.context or (64 if args.tiny else 2048)
    args.capacity = args.capacity or 2 * args.context
    args.bucket = args.bucket or (32 if args.tiny else 512)
    args.steps = args.steps or (3 if args.tiny else 20)
    if args.tiny:
        args.warmup = min(args.warmup, 1)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU here: run with --tiny")
    names = [name for name in args.attention.split(",") if name]
    if not set(names) <= set(ATTENTIONS):
        parser.error(f"--attention takes {', '.join(ATTENTIONS)}")
    # The default is timed eagerly too; the stock attention is the reference.
    names = ["slots", *(name for name in names if name not in ("slots", "stock")), "stock"]
    counts = [int(n) for n in args.slots.split(",")]
    dtype = torch.float32 if args.tiny else torch.bfloat16
    llm = build(TINY if args.tiny else QWEN3_8B, args.device, dtype)
    # Random embeddings at the scale of the model's own.
    scale = float(llm.model.embed_tokens.weight.detach().float().std())
    cache = SlotCache(llm.config, max(counts), args.capacity, bucket=args.bucket,
                      device=args.device, dtype=dtype)  # fmt: skip
    variants = {
        name: BatchedSteps(llm.model, cache, llm.lm_head, attention=ATTENTIONS[name][0])
        for name in names
    }
    if "fused" in variants:  # the engine's forward: its kernels on a GPU
        decoder = FusedDecoder(llm.model, use_kernels=args.device == "cuda")
        variants["fused"] = BatchedSteps(llm.model, cache, llm.lm_head, decoder=decoder)
    for _ in range(max(counts)):
        cache.acquire()
    fill(variants["slots"], args.context, chunk=32 if args.tiny else 256)
    if args.loop:
        return loop_mode(variants["slots"], counts, args, dtype)

    rows = []
    for n in counts:
        row: dict[str, Any] = {"slots": n}
        for kind, length in KINDS:
            row[kind] = measure(variants, n, length, args, scale)
        rows.append(row)
        print(json.dumps(row), flush=True)
    profiles = None
    if args.device == "cuda":
        profiles = {
            name: {kind: kernels(steps, max(counts), length, args, scale) for kind, length in KINDS}
            for name, steps in variants.items()
        }

    report = {
        **header(args, dtype),
        "columns": cache.columns,
        "attentions": {
            name: ATTENTIONS[name][0] or "the model's sdpa, every column" for name in names
        },
        "timed_steps": args.steps,
        "kv_bytes_per_slot": cache.nbytes_per_slot,
        "max_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if args.device == "cuda"
        else None,
        "rows": rows,
        "kernels_at_largest_n": profiles,
    }
    print_table(report, names, graphs=args.device == "cuda")
    save(report, args, "gpu_batch_steps")
    return 0


def header(args: Any, dtype: torch.dtype) -> dict[str, Any]:
    """What every report starts with: the machine and the configuration."""
    return {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (tiny)",
        "torch": torch.__version__,
        "shape": TINY if args.tiny else QWEN3_8B,
        "dtype": str(dtype),
        "context": args.context,
        "capacity": args.capacity,
        "bucket": args.bucket,
    }


def save(report: dict[str, Any], args: Any, stem: str) -> None:
    if args.tiny and args.out is None:
        return  # a smoke test: nothing saved
    name = report["gpu"].lower().replace(" ", "_")
    out = args.out or Path(__file__).parent / "results" / f"{stem}_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {out}")


async def lockstep(loop: BatchLoop, n: int, args: Any) -> list[float]:
    """``n`` sessions on slots 0..n-1, each feeding back its greedy token;
    session 0's ms from each submission to its result, over the warm ticks."""
    times: list[float] = []

    async def session(slot: int) -> None:
        token = torch.tensor([slot])
        for k in range(args.warmup + args.steps):
            started = time.perf_counter()
            result = await loop.forward(slot, token)
            if slot == 0 and k >= args.warmup:
                times.append((time.perf_counter() - started) * 1000)
            token = result.logits.argmax().reshape(1)

    async with asyncio.TaskGroup() as group:
        for slot in range(n):
            group.create_task(session(slot), name=f"session-{slot}")
    # Back to the same context for the next N (on the loop's thread: its cache).
    await loop.call(crop, loop.steps, n, args.context)
    return times


def loop_mode(steps: BatchedSteps, counts: list[int], args: Any, dtype: torch.dtype) -> int:
    """The ``--loop`` measure: one BatchLoop with graphs, N = each count."""
    loop = BatchLoop(steps, graphs=True)
    assert loop.graphs is not None
    rows = []
    try:
        for n in counts:
            loop.batch_sizes.clear()
            captured, gathers = loop.graphs.captures, loop.graphs.gathers
            times = asyncio.run(lockstep(loop, n, args))
            row = {
                "slots": n,
                "tick_ms": summary(times),
                "graphs_captured": loop.graphs.captures - captured,
                # Ticks read through a gather, not a prefix view (0 in lockstep).
                "gathered_ticks": loop.graphs.gathers - gathers,
                "batch_sizes": dict(sorted(loop.batch_sizes.items())),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        loop.close()
        loop.thread.join(5)
    report = {
        **header(args, dtype),
        "graphs": "cuda" if loop.graphs.capture else "simulated",
        "timed_ticks": args.steps,
        "graph_keys": [list(key) for key in loop.graphs.graphs],
        "rows": rows,
    }
    print(f"\n{report['gpu']}, {args.context} cached positions per slot, decode in lockstep "
          f"through BatchLoop ({report['graphs']} graphs): median (p95) ms per tick")  # fmt: skip
    for row in rows:
        print(f"{row['slots']:>7} sessions: {_cell(row['tick_ms']):>18}  "
              f"batches {row['batch_sizes']}  gathered {row['gathered_ticks']}")  # fmt: skip
    save(report, args, "gpu_batch_loop")
    return 0


def print_table(report: dict[str, Any], names: list[str], *, graphs: bool) -> None:
    print(f"\n{report['gpu']}, {report['context']} cached positions per slot of "
          f"{report['capacity']}, median (p95) ms per step [columns read]")  # fmt: skip
    for kind, _ in KINDS:
        header = ["slots", "eager slots", *(f"graph {name}" for name in names if graphs)]
        print(f"{kind:>9}: " + " ".join(f"{cell:>22}" for cell in header))
        for row in report["rows"]:
            step = row[kind]
            cells = [str(row["slots"]), f"{_cell(step['eager_ms'])} [{step['slots']['width']}]"]
            if graphs:
                cells += [f"{_cell(step[name]['graph_ms'])} [{step[name]['width']}]"
                          for name in names]  # fmt: skip
            print(" " * 11 + " ".join(f"{cell:>22}" for cell in cells))
    for name in names:
        worst = max(row[kind][name]["vs_reference"] for row in report["rows"] for kind, _ in KINDS)
        print(f"{name}: largest logit difference from the stock eager step {worst:.3g}")


def _cell(summary: dict[str, float]) -> str:
    return f"{summary['median']:.2f} ({summary['p95']:.2f})"


if __name__ == "__main__":
    sys.exit(main())
