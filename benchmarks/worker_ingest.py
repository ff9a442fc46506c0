"""What a worker's event loop spends reading its sessions' chunks, with the
gateway sending each ``audio_chunk`` as one binary media frame (its base64
decoded there; ``binary_media``, the default) and as the client's JSON text
(``OMNILIVE_BINARY_MEDIA=0``, the way before).

For each form, starts ``omnilive serve --engine scripted`` with one worker of
N slots and opens N omni duplex sessions through the gateway, each sending one
second of 16 kHz float32 audio and one 640x360 JPEG a second, at wall-clock
pace, for ``--seconds``. The scripted engine listens to every unit (schedule
``L``: a result a second, no answer audio), so what the worker spends is
mostly what it takes to read the chunks: the figure this measures. Reported
for each form, over the run after ``--warmup-s``, from /proc:

  worker_cpu_s_per_s    the worker process's CPU seconds per second
  gateway_cpu_s_per_s   the gateway's (it now decodes the base64)

and, in this process, what reading one such chunk costs each side
(``per_chunk_us``): the worker's reader, from the frame to its samples and
frames (``worker/chunk_media.py``), and the gateway's making of the frame.

The rounds alternate the forms (text, binary, text, binary, ...), so that a
drift of the machine falls on both. The load generator runs on the same
cores; its own CPU is reported too. Results: benchmarks/results/worker_ingest_cpu.json.

    python -m benchmarks.worker_ingest [--sessions 24] [--seconds 15] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tests.servers import Server

from benchmarks.load import Tally, proc_sample, run_session, save_result, this_machine, worker_pids
from omnilive.config import LimitSettings
from omnilive.gateway.sessions import binary_media
from omnilive.protocol import duplex
from omnilive.protocol.common import decode_client_message
from omnilive.worker.chunk_media import chunk_audio, chunk_frames, read_frame

FORMS = {"text": "0", "binary": "1"}  # OMNILIVE_BINARY_MEDIA


def camera_frame(seed: int = 7) -> bytes:
    """A 640x360 JPEG of a camera's detail (a gradient under noise), about
    the size a webcam frame is at quality 80."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:360, 0:640]
    base = np.stack([x * 255 / 640, y * 255 / 360, (x + y) * 255 / 1000], axis=-1)
    pixels = np.clip(base + rng.normal(0, 24, base.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "JPEG", quality=80)
    return buffer.getvalue()


def chunk_text(frame: bytes) -> str:
    """One second of speech-like audio (a tone under noise) with ``frame``."""
    t = np.arange(16_000) / 16_000
    rng = np.random.default_rng(3)
    audio = (0.1 * np.sin(2 * np.pi * 220 * t) + rng.normal(0, 0.01, t.size)).astype("<f4")
    return json.dumps({
        "type": "audio_chunk",
        "audio_base64": base64.b64encode(audio.tobytes()).decode(),
        "frame_base64_list": [base64.b64encode(frame).decode()],
    })  # fmt: skip


def per_chunk_us(chunk: str, repeats: int = 300) -> dict[str, float]:
    """Microseconds of CPU to read one chunk: the worker's reader for each
    form, and the gateway's making of the binary one (from its typed message)."""
    limits, max_bytes = LimitSettings(), 1 << 26
    adapter, types, fields = duplex.worker_message, duplex.WORKER_TYPES, duplex.ChunkFields
    typed = decode_client_message(chunk, adapter, types, max_bytes)
    sent = binary_media(chunk, typed)

    def reads(raw: str | bytes) -> None:
        message = read_frame(raw, adapter, types, max_bytes, fields)
        chunk_audio(message)
        chunk_frames(message, limits)

    def cost(work: Any) -> float:
        started = time.process_time()
        for _ in range(repeats):
            work()
        return round((time.process_time() - started) / repeats * 1e6, 1)

    return {
        "worker_text": cost(lambda: reads(chunk)),
        "worker_binary": cost(lambda: reads(sent)),
        "gateway_binary_frame": cost(lambda: binary_media(chunk, typed)),
    }


async def run_form(args: argparse.Namespace, form: str, chunk: str) -> dict[str, Any]:
    env = {
        "OMNILIVE_BINARY_MEDIA": FORMS[form],
        "OMNILIVE_SCRIPTED__SLOTS": str(args.sessions),
        "OMNILIVE_SCRIPTED__DUPLEX_SCHEDULE": "L",
        "OMNILIVE_DUPLEX__IDLE_TIMEOUT_S": "30",
        "OMNILIVE_RECORDING__ENABLED": "false",
        "OMNILIVE_LOG_LEVEL": "warning",
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), env=env).start()
        try:
            await server.wait_ready(workers=1, timeout=120)
            assert server.process is not None
            gateway, [worker] = server.process.pid, await worker_pids(server)
            now = time.monotonic()
            tally = Tally(measure_from=now + args.warmup_s)
            stop_at = now + args.warmup_s + args.seconds
            sessions = [
                run_session(
                    f"{server.ws}/ws/duplex/ingest{i}?mode=omni",
                    chunk,
                    now + i / args.sessions,  # their chunks spread over each second
                    stop_at,
                    tally,
                )
                for i in range(args.sessions)
            ]
            meter = asyncio.create_task(
                measure(gateway, worker, tally.measure_from, stop_at), name="ingest-meter"
            )
            client_cpu = sum(os.times()[:2])
            outcomes = await asyncio.gather(*sessions, return_exceptions=True)
            client_cpu = sum(os.times()[:2]) - client_cpu
            figures = await meter
        finally:
            server.stop()
    failed = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    return {
        "form": form,
        **figures,
        "client_cpu_s_per_s": round(client_cpu / (args.warmup_s + args.seconds + 1), 3),
        "results": tally.results,
        "errors": len(tally.errors) + len(failed),
        "error_samples": (tally.errors + failed)[:3],
    }


async def measure(gateway: int, worker: int, start: float, stop: float) -> dict[str, Any]:
    """Both processes' CPU seconds per second from ``start`` to ``stop``
    (monotonic), and the worker's over each second of it."""
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    began = time.monotonic()
    first = {pid: proc_sample(pid)[0] for pid in (gateway, worker)}
    seconds = []
    last, last_t = first[worker], began
    while (now := time.monotonic()) < stop:
        await asyncio.sleep(min(1.0, stop - now))
        cpu, now = proc_sample(worker)[0], time.monotonic()
        seconds.append((cpu - last) / (now - last_t))
        last, last_t = cpu, now
    span = time.monotonic() - began
    return {
        "window_s": round(span, 1),
        "worker_cpu_s_per_s": round((proc_sample(worker)[0] - first[worker]) / span, 3),
        "gateway_cpu_s_per_s": round((proc_sample(gateway)[0] - first[gateway]) / span, 3),
        "worker_cpu_s_per_s_max_1s": round(max(seconds), 3) if seconds else None,
    }


def summary(runs: list[dict[str, Any]], form: str) -> dict[str, Any]:
    mine = [run for run in runs if run["form"] == form]
    return {
        key: round(statistics.fmean(run[key] for run in mine), 3)
        for key in ("worker_cpu_s_per_s", "gateway_cpu_s_per_s", "client_cpu_s_per_s")
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=24, help="N omni duplex sessions")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured, after the warm-up")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each form, alternated")
    parser.add_argument("--name", default="worker_ingest_cpu", help="results file name")
    args = parser.parse_args()
    frame = camera_frame()
    chunk = chunk_text(frame)
    runs = []
    for _ in range(args.rounds):
        for form in FORMS:
            run = await run_form(args, form, chunk)
            print(
                f"{form:>6}: worker {run['worker_cpu_s_per_s']:.3f} CPU s/s (max "
                f"{run['worker_cpu_s_per_s_max_1s']}), gateway {run['gateway_cpu_s_per_s']:.3f}, "
                f"client {run['client_cpu_s_per_s']:.3f}; {run['results']} results, "
                f"{run['errors']} errors",
                flush=True,
            )
            runs.append(run)
    means = {form: summary(runs, form) for form in FORMS}
    text, binary = means["text"]["worker_cpu_s_per_s"], means["binary"]["worker_cpu_s_per_s"]
    report = {
        "machine": this_machine(),
        "sessions": args.sessions,
        "seconds": args.seconds,
        "chunk": {
            "audio_s": 1.0,
            "audio_rate": 16_000,
            "frame": "640x360 JPEG",
            "frame_bytes": len(frame),
            "message_bytes": len(chunk),
        },
        "mean": means,
        "per_chunk_us": per_chunk_us(chunk),
        "worker_cpu_saved_fraction": round(1 - binary / text, 3) if text else None,
        "runs": runs,
    }
    for form, figures in means.items():
        print(f"{form:>6} (mean of {args.rounds}): {figures}")
    print(f"the worker's CPU, binary against text: {binary:.3f} / {text:.3f} s/s")
    print(f"one chunk read, CPU us: {report['per_chunk_us']}")
    save_result(args.name, report)


if __name__ == "__main__":
    asyncio.run(main())
