"""MiniCPM-o on a GPU through omnilive: a random-weight checkpoint, then timings.

Two steps, meant for a machine with an NVIDIA GPU and no network:

``checkpoint --code DIR --out CKPT``
    Builds a checkpoint directory with random weights at the real size from
    the model's public code (see ``benchmarks/gpu_checkpoint.py``).

``run --model-path CKPT [--speech-wav WAV]``
    Starts ``omnilive serve --engine minicpmo``, then drives through the
    gateway: chat requests with audio output, half-duplex turns speaking the
    WAV at microphone pace (if given), an audio duplex and an omni
    duplex session (known listen/speak mix: forced listens from the client,
    bounded speak tokens per unit), and many short sessions to check that GPU
    memory returns to its level after each. Writes a new JSON report named
    after the GPU and the time under ``benchmarks/results/`` (or ``--out``,
    an existing file only with ``--overwrite``).

Measures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from websockets.asyncio.client import connect

from benchmarks.bench_server import (
    add_server_arguments,
    free_port,
    server_env,
    start_server,
    stop_server,
    wait_ready,
)
from benchmarks.gpu_checkpoint import CODE_FILES, build_checkpoint, synthetic_voice
from benchmarks.microphone import RATE, Microphone, spoken_turn
from omnilive.audio import read_wav, resample

# --- measuring ----------------------------------------------------------------


class GpuSampler(threading.Thread):
    """``nvidia-smi`` memory in use, sampled; the device's view, caches included."""

    def __init__(self, period_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.peak_mib = 0.0
        self.busy_percent: list[float] = []
        self._stop_event = threading.Event()

    @staticmethod
    def query(field: str) -> str:
        """One value of GPU 0, or "" where there is no nvidia-smi (dry runs)."""
        try:
            result = subprocess.run(
                ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, check=True, timeout=10,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return ""
        return result.stdout.strip()

    def used_mib(self) -> float:
        return float(self.query("memory.used") or 0)

    def run(self) -> None:
        while not self._stop_event.is_set():
            used, _, busy = self.query("memory.used,utilization.gpu").partition(",")
            self.peak_mib = max(self.peak_mib, float(used or 0))
            if busy.strip():
                self.busy_percent.append(float(busy))
            self._stop_event.wait(self.period_s)

    def mean_busy(self) -> float | None:
        """The mean of ``utilization.gpu`` since the list was last emptied:
        the share of time a kernel ran, not how much of the GPU it used."""
        samples = self.busy_percent
        return round(sum(samples) / len(samples), 1) if samples else None

    def stop(self) -> None:
        self._stop_event.set()


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<f4").tobytes()).decode()


def jpeg_b64(seed: int) -> str:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=80)
    return base64.b64encode(buffer.getvalue()).decode()


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "median": round(statistics.median(ordered), 1),
        "p95": round(p95, 1),
        "mean": round(statistics.fmean(ordered), 1),
        "max": round(ordered[-1], 1),
    }


async def recv_until(ws: Any, *types: str, timeout: float = 120) -> dict[str, Any]:
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if message.get("type") == "error":
            raise RuntimeError(f"server error: {message}")
        if message.get("type") in types:
            return message


async def chat_request(
    base: str,
    voice: np.ndarray | None,
    index: int,
    max_new_tokens: int = 48,
    until_first_audio: bool = False,
) -> dict[str, Any]:
    """One streamed spoken chat answer's timings, in ``voice`` (None: the
    server's default); with ``until_first_audio`` the client leaves at the
    first audio chunk (the server cancels the rest)."""
    speech = synthetic_voice(2.0)
    payload = {
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": f"Request {index}: answer briefly."},
            {"type": "audio", "data": b64(speech)},
        ]}],
        "streaming": True,
        "generation": {"max_new_tokens": max_new_tokens},
        "tts": {"enabled": True, **({"ref_audio_data": b64(voice)} if voice is not None else {})},
    }  # fmt: skip
    started = time.perf_counter()
    first_chunk = first_audio = prefill = None
    audio_s = 0.0
    async with connect(f"{base}/ws/chat", max_size=None) as ws:
        await ws.send(json.dumps(payload))
        async for raw in ws:
            message = json.loads(raw)
            now = (time.perf_counter() - started) * 1000
            kind = message.get("type")
            if kind == "prefill_done":
                prefill = now
            elif kind == "chunk":
                first_chunk = first_chunk or now
                if message.get("audio_data"):
                    first_audio = first_audio or now
                    audio_s += len(base64.b64decode(message["audio_data"])) / 4 / 24000
            if kind == "done" or (until_first_audio and first_audio is not None):
                return {
                    "prefill_done_ms": prefill, "first_chunk_ms": first_chunk,
                    "first_audio_ms": first_audio, "total_ms": now, "audio_s": round(audio_s, 2),
                    "input_tokens": message.get("input_tokens"),
                    "generated_tokens": message.get("generated_tokens"),
                    "text": message.get("text", "")[:80],
                }  # fmt: skip
            elif kind == "error":
                raise RuntimeError(f"chat failed: {message}")
    raise RuntimeError("chat ended without done")


async def half_duplex_session(base: str, speech: np.ndarray, turns: int) -> list[dict[str, Any]]:
    """Spoken turns in one half-duplex session (server-side VAD, 800 ms of
    silence ends a turn), with short answers so each turn ends in time."""
    sid = f"bench_hd_{time.monotonic_ns()}"
    async with connect(f"{base}/ws/half_duplex/{sid}", max_size=None) as ws:
        await recv_until(ws, "queue_done")
        await ws.send(json.dumps({
            "type": "prepare",
            "system_prompt": "You are a helpful assistant.",
            "config": {"vad": {"min_silence_duration_ms": 800},
                       "generation": {"max_new_tokens": 24}},
        }))  # fmt: skip
        await recv_until(ws, "prepared")
        mic = Microphone(ws, 0.1)
        await mic.play(np.zeros(int(0.6 * RATE), np.float32))  # past the cold-start guard
        rows = []
        for _ in range(turns):
            turn = await spoken_turn(ws, mic, speech)
            rows.append({"vad_ms": turn.vad_ms, "first_audio_ms": turn.first_audio_ms,
                         "after_vad_ms": turn.after_vad_ms,
                         "timings": turn.done.get("timings", {}),
                         "text": turn.done.get("text", "")[:80]})  # fmt: skip
            await asyncio.sleep(0.8)  # the spec's pause after playback
        await ws.send(json.dumps({"type": "stop"}))
        await recv_until(ws, "stopped", "timeout")
    return rows


async def duplex_session(
    base: str, mode: str, units: int, listen_every: int, voice: np.ndarray | None
) -> dict[str, Any]:
    """One session; unit k is forced to listen when ``k % listen_every == 0``
    (``listen_every=0``: never), the engine forces the first units itself."""
    sid = f"bench_{mode}_{time.monotonic_ns()}"
    results = []
    async with connect(f"{base}/ws/duplex/{sid}?mode={mode}", max_size=None) as ws:
        await recv_until(ws, "queue_done")
        prepare: dict[str, Any] = {
            "type": "prepare",
            "system_prompt": "You are a helpful assistant.",
        }
        if voice is not None:
            prepare["ref_audio_base64"] = b64(voice)
        await ws.send(json.dumps(prepare))
        prepared = await recv_until(ws, "prepared")
        speech = synthetic_voice(float(units) + 1)
        for k in range(units):
            chunk: dict[str, Any] = {
                "type": "audio_chunk",
                "audio_base64": b64(speech[k * 16000 : (k + 1) * 16000]),
                "force_listen": bool(listen_every) and k % listen_every == 0,
            }
            if mode == "omni_duplex":
                chunk["frame_base64_list"] = [jpeg_b64(k)]
            sent = time.perf_counter()
            await ws.send(json.dumps(chunk))
            result = await recv_until(ws, "result")
            result["client_ms"] = (time.perf_counter() - sent) * 1000
            result.pop("audio_data", None)
            results.append(result)
        await ws.send(json.dumps({"type": "stop"}))
        await recv_until(ws, "stopped")
    return {"prompt_length": prepared.get("prompt_length"), "units": results}


def unit_figures(units: list[dict[str, Any]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for label, is_listen in (("listen", True), ("speak", False)):
        chosen = [u for u in units if u["is_listen"] is is_listen]
        figures[label] = {
            "wall_clock_ms": summary([u["wall_clock_ms"] for u in chosen]),
            "client_ms": summary([u["client_ms"] for u in chosen]),
            "prefill_ms": summary([u["cost_prefill_ms"] for u in chosen]),
            "generate_ms": summary([u["cost_all_ms"] - u["cost_prefill_ms"] for u in chosen]),
            "tts_ms": summary([u["cost_tts_ms"] for u in chosen]),
            "token2wav_ms": summary([u["cost_token2wav_ms"] for u in chosen]),
            "n_tokens": summary([u["n_tokens"] for u in chosen]),
            "n_tts_tokens": summary([u["n_tts_tokens"] for u in chosen]),
        }
    figures["kv_cache_length_last"] = units[-1]["kv_cache_length"] if units else 0
    figures["vision"] = {
        "slices": summary([u["vision_slices"] for u in units]),
        "tokens": summary([u["vision_tokens"] for u in units]),
    }
    figures["end_of_turn_units"] = sum(1 for u in units if u["end_of_turn"])
    figures["sample_text"] = next((u["text"] for u in units if u["text"]), "")
    return figures


def model_code(ckpt: Path) -> str:
    """The model class the checkpoint's config names (none for dry runs)."""
    config = ckpt / "config.json"
    if not config.exists():
        return "none"
    return json.loads(config.read_text()).get("auto_map", {}).get("AutoModel", "none")


def vocoder_kind(ckpt: Path) -> str:
    """The first paragraph of the vocoder stand-in's docstring, or "none"."""
    module = ckpt / "standin" / "stepaudio2" / "__init__.py"
    if not module.exists():
        return "none"
    paragraph = module.read_text().split('"""')[1].split("\n\n")[0]
    return " ".join(paragraph.split())


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    ckpt = args.model_path.resolve()
    port = free_port()
    env = server_env(
        ckpt,
        args.speak_tokens,
        OMNILIVE_MINICPMO__TORCH_COMPILE="true" if args.torch_compile else "false",
        OMNILIVE_MINICPMO__CUDA_GRAPHS="false" if args.no_cuda_graphs else "true",
        OMNILIVE_MINICPMO__SLOTS=str(args.slots),
    )
    sampler = GpuSampler()
    baseline_mib = sampler.used_mib()
    sampler.start()
    server, log = start_server(args, ckpt, port, env)
    http, ws = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"
    report: dict[str, Any] = {
        "gpu": GpuSampler.query("name") or "no GPU",
        "engine": args.engine,
        "speak_tokens_per_unit": args.speak_tokens,
        "torch_compile": args.torch_compile,
        "cuda_graphs": not args.no_cuda_graphs and not args.torch_compile,
        "model_code": model_code(ckpt),
        "vocoder": vocoder_kind(ckpt),
        "baseline_mib": baseline_mib,
    }

    def save() -> None:  # after every stage: a run cut short still leaves its figures
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))

    try:
        report["load_s"] = round(await wait_ready(http, server, args.load_timeout), 1)
        report["after_load_mib"] = sampler.used_mib()
        save()
        voice = synthetic_voice(3.0)
        report["chat"] = [await chat_request(ws, voice, i) for i in range(args.chats)]
        save()
        if args.speech_wav is not None:
            speech, rate = read_wav(args.speech_wav.read_bytes())
            speech = resample(speech, rate, RATE)
            turns = await half_duplex_session(ws, speech, args.turns)
            report["half_duplex"] = {
                "speech_s": round(speech.size / RATE, 2),
                "vad_ms": summary([t["vad_ms"] for t in turns]),
                "first_audio_after_speech_ms": summary([t["first_audio_ms"] for t in turns]),
                "first_audio_after_vad_ms": summary([t["after_vad_ms"] for t in turns]),
                "turns": turns,
            }
            save()
        for mode in ("audio_duplex", "omni_duplex"):
            session = await duplex_session(ws, mode, args.units, 3, voice)
            report[mode] = {
                "prompt_length": session["prompt_length"],
                **unit_figures(session["units"]),
            }
            report[mode + "_units"] = session["units"]
            save()
        memory = []
        for k in range(args.sessions):
            if k % 10 == 5:
                await chat_request(ws, voice, 1000 + k, max_new_tokens=8)
            else:
                await duplex_session(ws, "audio_duplex", 2, 0, voice)
            memory.append(sampler.used_mib())
        report["sessions"] = {"count": args.sessions, "used_mib": memory,
                              "growth_mib": memory[-1] - memory[0] if memory else 0}  # fmt: skip
    finally:
        sampler.stop()
        report["peak_mib"] = sampler.peak_mib
        stop_server(server, log)
    chats = report.get("chat", [])
    report["chat_first_audio_ms"] = summary(
        [c["first_audio_ms"] for c in chats if c["first_audio_ms"]]
    )
    save()
    return report


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\nGPU {report['gpu']}: load {report.get('load_s')} s, peak {report['peak_mib']:.0f} MiB"
    )
    for mode in ("audio_duplex", "omni_duplex"):
        for kind in ("listen", "speak"):
            f = report.get(mode, {}).get(kind, {})
            wall, pre, gen = (
                f.get("wall_clock_ms", {}),
                f.get("prefill_ms", {}),
                f.get("generate_ms", {}),
            )
            print(
                f"{mode:13} {kind:6} n={wall.get('n', 0):3} wall median {wall.get('median')} "
                f"p95 {wall.get('p95')} | prefill {pre.get('median')} "
                f"| generate {gen.get('median')}"
            )
    print(f"chat first audio: {report.get('chat_first_audio_ms')}")
    if "half_duplex" in report:
        turns = report["half_duplex"]
        print(f"half-duplex first audio after speech: {turns['first_audio_after_speech_ms']}, "
              f"after the VAD's end of turn: {turns['first_audio_after_vad_ms']}")  # fmt: skip
    print(f"sessions: growth {report.get('sessions', {}).get('growth_mib')} MiB")


# --- results files --------------------------------------------------------------

RESULTS = Path(__file__).parent / "results"


def new_result_path(stem: str, suffix: str = "") -> Path:
    """``benchmarks/results/<stem>_<gpu><suffix>_<UTC time>.json``: a new file
    for every run, so that a rerun never replaces a committed result (the docs
    cite them by name)."""
    gpu = re.sub(r"[^a-z0-9]+", "_", (GpuSampler.query("name") or "no GPU").lower()).strip("_")
    return RESULTS / f"{stem}_{gpu}{suffix}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


def refuse_existing(parser: argparse.ArgumentParser, out: Path, overwrite: bool) -> None:
    """Stop before the server starts where the report would replace a file."""
    if out.exists() and not overwrite:
        parser.error(f"{out} exists: give another --out, or --overwrite to replace it")


def run_saved(
    parser: argparse.ArgumentParser,
    stem: str,
    bench: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]],
    argv: list[str] | None,
) -> int:
    """A density benchmark's end of ``main``: ``--overwrite``, the report's
    path (a new one unless ``--out``; never a committed file), the run, and
    its figures but the levels' printed."""
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = new_result_path(stem)
    refuse_existing(parser, args.out, args.overwrite)
    print(f"report: {args.out}", flush=True)
    report = asyncio.run(bench(args))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("checkpoint")
    build.add_argument(
        "--code",
        type=Path,
        required=True,
        help="the model's code: the MiniCPMO45 folder of OpenBMB/MiniCPM-o-Demo",
    )
    build.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    build.add_argument("--tiny", action="store_true")
    build.add_argument(
        "--tone-vocoder",
        action="store_true",
        help="a tone generator for the vocoder (no minicpmo-utils needed: equality runs)",
    )
    build.add_argument("--device", default="cuda")
    run = commands.add_parser("run")
    run.add_argument("--model-path", type=Path, required=True)
    run.add_argument("--units", type=int, default=36)
    run.add_argument("--chats", type=int, default=4)
    run.add_argument("--sessions", type=int, default=50)
    run.add_argument("--speak-tokens", type=int, default=12)
    add_server_arguments(run, "gpu_duplex_server.log", "/tmp/omnilive-bench-data")
    run.add_argument(
        "--speech-wav",
        type=Path,
        help="a spoken question (WAV) for half-duplex turns; none: no such turns",
    )
    run.add_argument("--turns", type=int, default=5)
    run.add_argument("--torch-compile", action="store_true", help="minicpmo.torch_compile")
    run.add_argument("--no-cuda-graphs", action="store_true", help="minicpmo.cuda_graphs off")
    run.add_argument(
        "--slots",
        type=int,
        default=1,
        help="minicpmo.slots (1: one session at a time, in one slot)",
    )
    run.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.command == "checkpoint":
        missing = [name for name in CODE_FILES if not (args.code / name).is_file()]
        if missing:
            parser.error(
                f"--code {args.code} is not the MiniCPMO45 model-code folder: it lacks "
                + ", ".join(missing)
            )
        build_checkpoint(args.code, args.out, args.tiny, args.device, args.tone_vocoder)
        return 0
    if args.out is None:
        suffix = "_compiled" if args.torch_compile else "_eager" if args.no_cuda_graphs else ""
        args.out = new_result_path("gpu_duplex", suffix)
    refuse_existing(parser, args.out, args.overwrite)
    report = asyncio.run(bench(args))
    print_table(report)
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
