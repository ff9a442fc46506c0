"""OpenAI's Live API on MiniCPM-o (GPU): what the dialect adds to the first audio.

The latency half of ``benchmarks.live_dialect`` against ``omnilive serve
--engine minicpmo`` on a checkpoint (random weights: real compute, nonsense
speech): the same spoken questions through ``/v1/live/sessions`` and through
the engine's own duplex route (``/ws/duplex``, audio duplex), in 1 s pieces at
microphone pace, alternating which route goes first, each timed from the end
of the speech to its first audio. Random weights speak from the first unit
the model may (``minicpmo.force_listen_units`` listen first), so both routes
answer in the same unit and a pair's difference is what the Live route adds.
The side Whisper is off (the GPU machine has no faster-whisper), as in
``live_dialect --no-transcripts``.

    python -m benchmarks.live_gpu --model-path CKPT [--questions 8]

A machine without espeak-ng replays the questions this machine spoke into
``OMNILIVE_SPEECH_CACHE`` (``tests/speech.py``). Saved as
``live_gpu_<gpu>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bench_server
from benchmarks.gpu_duplex import GpuSampler
from benchmarks.live_dialect import latency
from benchmarks.load import save_result, this_machine


@dataclass(frozen=True)
class Endpoint:
    """Where ``live_dialect``'s route clients connect (its ``Server``'s ``ws``)."""

    ws: str


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    port = bench_server.free_port()
    env = bench_server.server_env(
        args.model_path, args.speak_tokens, OMNILIVE_TRANSCRIPTION__WHISPER="false"
    )
    server, log = bench_server.start_server(args, args.model_path, port, env)
    try:
        load_s = await bench_server.wait_ready(
            f"http://127.0.0.1:{port}", server, args.load_timeout
        )
        figures: dict[str, Any] = {
            "machine": this_machine(),
            "gpu": GpuSampler.query("name") or "no GPU",
            "engine": args.engine,
            "transcripts": False,
            "load_s": round(load_s, 1),
        }
        figures["latency"] = await latency(Endpoint(f"ws://127.0.0.1:{port}"), args.questions)
        return figures
    except BaseException:
        print(f"the server's log, the end:\n{args.log.read_text()[-6000:]}", file=sys.stderr)
        raise
    finally:
        bench_server.stop_server(server, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--speak-tokens", type=int, default=12)
    bench_server.add_server_arguments(parser, "/tmp/live_gpu_server.log", "/tmp/live_gpu_data")
    args = parser.parse_args(argv)
    figures = asyncio.run(bench(args))
    name = figures["gpu"].lower().replace(" ", "_")
    path = save_result(f"live_gpu_{name}", figures)
    print(json.dumps({k: v for k, v in figures["latency"].items() if k != "rows"}, indent=2))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
