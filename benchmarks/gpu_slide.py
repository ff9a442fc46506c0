"""What a window's slide costs the batch loop's thread: the slot-cache edits
of ``runtime/cache_edits.py``, the torch rule against the turning kernel.

A basic window lets go of several units at once: ``drop_positions`` with one
run a unit, each kept key turned once per run. Measured on a slot cache of the
real size (Qwen3-8B's 36 layers, 8 K/V heads of 128, bf16; 16 slots of 8,192
positions): a slide of ``--units`` units of ``--unit-positions`` from a slot
holding ``--length`` positions, and a context window's lift and put-back of
what follows the system prompt. For each: the host's milliseconds (the loop's
thread, until the call returns) and the GPU's (until it has done the work),
medians of ``--repeats``; and whether the two rules leave the same bits.

``python -m benchmarks.gpu_slide`` on a GPU saves
``benchmarks/results/gpu_slide_<gpu>.json``; ``--tiny`` runs a small cache on
the CPU (the kernel in Triton's interpreter, where ``TRITON_INTERPRET=1``)
to check the script. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.load import save_result

SYSTEM_POSITIONS = 300  # at most a quarter of the slot's length
THETA = 1e6  # Qwen3's rope_theta


def make_cache(tiny: bool, device: str) -> Any:
    import torch

    from omnilive.engines.minicpmo.runtime.batch import SlotCache

    if tiny:
        config = SimpleNamespace(num_key_value_heads=2, head_dim=32, num_hidden_layers=3)
        return SlotCache(config, 2, 1024, bucket=64, device=device, dtype=torch.bfloat16)
    config = SimpleNamespace(num_key_value_heads=8, head_dim=128, num_hidden_layers=36)
    return SlotCache(config, 16, 8192, device=device, dtype=torch.bfloat16)


def timed(edit: Callable[[], None], reset: Callable[[], None], repeats: int) -> dict[str, float]:
    """Medians of the host's and the GPU's milliseconds of ``edit``."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    host, total = [], []
    for _ in range(repeats):
        reset()
        sync()
        started = time.perf_counter()
        edit()
        returned = time.perf_counter()
        sync()
        host.append((returned - started) * 1000)
        total.append((time.perf_counter() - started) * 1000)
    return {
        "host_ms": round(statistics.median(host), 3),
        "gpu_ms": round(statistics.median(total), 3),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from omnilive.engines.minicpmo.runtime import cache_edits, turn_kernel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cache = make_cache(args.tiny, device)
    slot = cache.acquire()
    generator = torch.Generator(device=device).manual_seed(0)
    filled = torch.randn(
        cache.keys[:, slot, :, : args.length].shape, generator=generator, device=device
    )
    original = (filled.to(cache.keys.dtype), filled.flip(-1).to(cache.keys.dtype))

    def reset() -> None:
        cache.keys[:, slot, :, : args.length] = original[0]
        cache.values[:, slot, :, : args.length] = original[1]
        cache.lengths[slot] = args.length

    system = min(SYSTEM_POSITIONS, args.length // 4)
    runs = [args.unit_positions] * args.units

    def slide(kernel: bool) -> Callable[[], None]:
        return lambda: cache_edits.drop_positions(cache, slot, system, runs, THETA, kernel=kernel)

    def rewrite(kernel: bool) -> Callable[[], None]:
        def edit() -> None:
            lifted = cache_edits.lift_positions(cache, slot, system + sum(runs))
            cache.lengths[slot] = system + args.unit_positions  # the "previous" block
            cache_edits.put_back(cache, slot, lifted, THETA, kernel=kernel)

        return edit

    rules = {"torch": False, "kernel": True} if turn_kernel.AVAILABLE else {"torch": False}
    if device == "cuda" and "kernel" in rules:
        turn_kernel.warm(cache.keys[:, cache.idle])
        if not turn_kernel.KERNEL.on:
            del rules["kernel"]
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (tiny)",
        "layers": cache.keys.shape[0],
        "length": args.length,
        "units": args.units,
        "unit_positions": args.unit_positions,
    }
    for kind, make in (("basic_slide", slide), ("context_rewrite", rewrite)):
        figures, bits = {}, []
        for name, kernel in rules.items():
            edit = make(kernel)
            edit_once = timed(edit, reset, 1)  # a first call: compiles, allocates
            figures[name] = {
                **timed(edit, reset, args.repeats),
                "first_host_ms": edit_once["host_ms"],
            }
            reset()
            edit()
            n = cache.lengths[slot]
            bits.append((cache.keys[:, slot, :, :n].clone(), cache.values[:, slot, :, :n].clone()))
        same = None
        if len(bits) == 2:  # the kernel's keys and values against the torch rule's
            same = all(torch.equal(a, b) for a, b in zip(*bits, strict=True))
        result[kind] = {**figures, "same_bits": same}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="a small cache on the CPU")
    parser.add_argument("--length", type=int, default=4050, help="positions the slot holds")
    parser.add_argument("--units", type=int, default=6, help="units a slide lets go")
    parser.add_argument("--unit-positions", type=int, default=84, help="an omni unit's positions")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="where to save (default: results/)")
    args = parser.parse_args(argv)
    if args.tiny:  # Triton's interpreter takes seconds a slide
        args.length = min(args.length, 200)
        args.units = min(args.units, 3)
        args.unit_positions = min(args.unit_positions, 20)
        args.repeats = min(args.repeats, 2)
    result = measure(args)
    for kind in ("basic_slide", "context_rewrite"):
        print(kind, result[kind])
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"saved {args.out}")
    elif not args.tiny:
        gpu = str(result["gpu"]).lower().replace(" ", "_")
        save_result(f"gpu_slide_{gpu}", result)
    return (
        0
        if all(result[k]["same_bits"] is not False for k in ("basic_slide", "context_rewrite"))
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
