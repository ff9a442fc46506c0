"""Where a duplex unit's encoder time goes, on one GPU at full size (random
weights, the benchmark checkpoint of benchmarks/gpu_checkpoint.py).

For ``--sessions`` sessions, each with a 640x480 camera frame and one second
of audio per unit, over ``--units`` units:

- the vision encoder one session at a time, then over every session's frame
  as ONE call (:func:`~omnilive.engines.minicpmo.sessions.encoders.units.vision_pieces`, what
  the side lane gathers), its layers through CUDA graphs as the engine runs
  them, and one session at a time again with eager layers (the largest
  difference of their embeddings is saved: graphs replay the same kernels);
- the streaming Whisper encoder, one session at a time (its KV cache is the
  session's own), as the model code runs it (no cuDNN attention) and again
  with cuDNN's attention, which builds a plan for each new cache length;
  then as the engine runs it (``audio_embeddings_together``, one session a
  call, as its lane mostly runs at 12 sessions), through its graphs between
  the attentions and eagerly (the largest difference saved).

Per call: the wall clock (after a synchronize) and the *launch* time (until
the call returned, before the synchronize: the CPU's share; where it is close
to the wall clock the call is bound by kernel launches, which batching or CUDA
graphs remove). Then a profile of one call of each: CUDA kernel launches,
host synchronisations, and the operators that take the CPU's time.

    python -m benchmarks.gpu_encoders --ckpt /tmp/ckpt --out benchmarks/results/gpu_encoders.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.duplex_equality import load_reference

WARM = 2


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, its launch ms (until it returned) and wall ms (synchronized)."""
    sync()
    started = time.perf_counter()
    result = fn()
    launched = time.perf_counter()
    sync()
    done = time.perf_counter()
    return result, (launched - started) * 1000, (done - started) * 1000


def figures(launch: list[float], wall: list[float], per: int = 1) -> dict[str, float]:
    return {
        "calls": len(wall),
        "wall_ms_p50": round(statistics.median(wall), 2),
        "launch_ms_p50": round(statistics.median(launch), 2),
        "wall_ms_mean": round(statistics.fmean(wall), 2),
        "wall_ms_max": round(max(wall), 2),
        "wall_ms_per_session": round(statistics.median(wall) / per, 2),
    }


def profile(fn: Callable[[], Any]) -> dict[str, Any]:
    """Kernel launches, host syncs and the top CPU operators of one ``fn()``."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    sync()
    with torch_profile(activities=activities) as prof:
        fn()
        sync()
    events = prof.key_averages()
    count = {e.key: e.count for e in events}
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {
        "kernel_launches": count.get("cudaLaunchKernel", 0) + count.get("cuLaunchKernel", 0),
        "stream_syncs": count.get("cudaStreamSynchronize", 0),
        "memcpy": count.get("cudaMemcpyAsync", 0),
        "top_self_cpu_ms": {e.key: round(e.self_cpu_time_total / 1000, 2) for e in top},
        "cuda_ms": round(sum(e.self_device_time_total for e in events) / 1000, 2),
    }


@contextlib.contextmanager
def cudnn_attention(enabled: bool) -> Iterator[None]:
    """torch's cuDNN attention kernels on or off for the block (the engine
    runs with them off: omnilive.engines.minicpmo.sessions.views.SlotEngine.build)."""
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from PIL import Image

    from omnilive.engines.minicpmo.sessions.duplex.unit_rules import UnitRules
    from omnilive.engines.minicpmo.sessions.encoders.units import (
        AudioStream,
        Frames,
        audio_embeddings,
        audio_embeddings_together,
        audio_features,
        vision_pieces,
    )
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

    duplex = load_reference(args.ckpt, "unified", args.device, args.dtype, 20, 0)
    torch.backends.cuda.enable_cudnn_sdp(False)  # as the engine runs
    shared = SharedModel.of_duplex(duplex, UnitRules.unified())
    shared.encoder_graphs = True  # measured against the eager path below
    rng = np.random.default_rng(0)
    n = args.sessions
    frames = [
        [Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)) for _ in range(n)]
        for _ in range(args.units)
    ]
    seconds = [
        [(0.1 * rng.standard_normal(16_000)).astype(np.float32) for _ in range(n)]
        for _ in range(args.units)
    ]
    streams = [AudioStream(mel=shared.new_mel()) for _ in range(n)]
    # The same audio again, with cuDNN's attention kernels allowed (torch
    # tries them first on an H100/H200), which the engine turns off.
    default_streams = [AudioStream(mel=shared.new_mel()) for _ in range(n)]
    # The engine's path over the same features, with its graphs and without.
    engine_streams = {graphs: [AudioStream(mel=None) for _ in range(n)] for graphs in (True, False)}
    engine: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    whisper_graphs_vs_eager = 0.0

    alone: tuple[list[float], list[float]] = ([], [])
    alone_eager: tuple[list[float], list[float]] = ([], [])
    graphs_vs_eager = 0.0
    together: tuple[list[float], list[float]] = ([], [])
    whisper: tuple[list[float], list[float]] = ([], [])
    whisper_default: tuple[list[float], list[float]] = ([], [])
    for u in range(args.units):
        items = [
            Frames(shared.processor.process_image([frame], max_slice_nums=1), [frame], 1)
            for frame in frames[u]
        ]
        separate = [timed(lambda item=item: vision_pieces(shared, [item])) for item in items]
        eager = [
            timed(lambda item=item: vision_pieces(shared, [item], graphs=False)) for item in items
        ]
        _, launch, wall = timed(lambda items=items: vision_pieces(shared, items))
        features = [audio_features(shared, s, a) for s, a in zip(streams, seconds[u], strict=True)]
        encoded = [
            timed(lambda s=s, f=f: audio_embeddings(shared, s, f))
            for s, f in zip(streams, features, strict=True)
            if f is not None
        ]
        made: dict[bool, list[Any]] = {}
        for graphs, own in engine_streams.items():
            made[graphs] = [
                timed(
                    lambda s=s, f=f, g=graphs: audio_embeddings_together(shared, [(s, f)], graphs=g)
                )
                for s, f in zip(own, features, strict=True)
                if f is not None
            ]
        default_features = [
            audio_features(shared, s, a) for s, a in zip(default_streams, seconds[u], strict=True)
        ]
        with cudnn_attention(True):
            encoded_default = [
                timed(lambda s=s, f=f: audio_embeddings(shared, s, f))
                for s, f in zip(default_streams, default_features, strict=True)
                if f is not None
            ]
        if u < WARM:
            continue
        for graphs, results in made.items():
            for _, launched, walled in results:
                engine[graphs][0].append(launched)
                engine[graphs][1].append(walled)
        for (a, _, _), (b, _, _) in zip(made[True], made[False], strict=True):
            difference_ = float((a[0].float() - b[0].float()).abs().max())
            whisper_graphs_vs_eager = max(whisper_graphs_vs_eager, difference_)
        for _, launched, walled in encoded_default:
            whisper_default[0].append(launched)
            whisper_default[1].append(walled)
        for _, launched, walled in separate:
            alone[0].append(launched)
            alone[1].append(walled)
        for _, launched, walled in eager:
            alone_eager[0].append(launched)
            alone_eager[1].append(walled)
        for (graphed, _, _), (plain, _, _) in zip(separate, eager, strict=True):
            for a, b in zip(graphed[0], plain[0], strict=True):
                graphs_vs_eager = max(graphs_vs_eager, float((a.float() - b.float()).abs().max()))
        together[0].append(launch)
        together[1].append(wall)
        for _, launched, walled in encoded:
            whisper[0].append(launched)
            whisper[1].append(walled)
        batched = [p.float() for pieces in vision_pieces(shared, items) for p in pieces]
        single = [p.float() for r in separate for p in r[0][0]]
        difference = max(float((a - b).abs().max()) for a, b in zip(batched, single, strict=True))

    item = items[0]
    stream, feature = streams[0], audio_features(shared, streams[0], seconds[-1][0])
    report = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "sessions": n,
        "units_timed": args.units - WARM,
        "vision_alone": figures(*alone),
        "vision_alone_eager_layers": figures(*alone_eager),
        "vision_graphs_vs_eager_max_abs": graphs_vs_eager,
        "vision_graphs": shared.lane_graphs().get("vision"),
        "vision_batched": figures(*together, per=n),
        "vision_batched_vs_alone_max_abs": difference,
        "whisper_alone": figures(*whisper),
        "whisper_alone_cudnn_attention": figures(*whisper_default),
        "whisper_engine_graphs": figures(*engine[True]),
        "whisper_engine_eager": figures(*engine[False]),
        "whisper_graphs_vs_eager_max_abs": whisper_graphs_vs_eager,
        "whisper_graphs": shared.lane_graphs().get("whisper"),
        "profile_vision_one": profile(lambda: vision_pieces(shared, [item])),
        "profile_vision_one_eager_layers": profile(
            lambda: vision_pieces(shared, [item], graphs=False)
        ),
        "profile_vision_batched": profile(lambda: vision_pieces(shared, items)),
    }
    if feature is not None:
        report["profile_whisper_one"] = profile(lambda: audio_embeddings(shared, stream, feature))
        graphed = engine_streams[True][0]
        report["profile_whisper_engine_graphs"] = profile(
            lambda: audio_embeddings_together(shared, [(graphed, feature)])
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
