"""The streaming vocoder on one GPU: the model code's own ``stream()`` against
omnilive's :class:`FlowRunner` (eager, then with the flow's CUDA graphs), on
minicpmo-utils' real Token2wav code at the published sizes with random
weights (benchmarks/standins/random_vocoder.py).

Each session voices ``--chunks`` seconds (25 new speech tokens a push, as a
duplex unit does); every push starts from the same random seed in every
variant, so HiFT's noise is the same and the audio can be compared sample by
sample. Printed and saved: ms per one-second chunk per variant (after the
first three, where graphs are warmed up and captured), the largest sample
difference of each variant from the model code, ``--sessions`` sessions
interleaved chunk by chunk on one runner against each run alone (the
isolation of their caches), and the same sessions voiced together
(:func:`voice_together`: one flow batch a round), ms a round.

    python -m benchmarks.gpu_vocoder --out benchmarks/results/gpu_vocoder.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.gpu_checkpoint import STANDINS, synthetic_voice
from omnilive.audio import wav_bytes
from omnilive.engines.minicpmo.sessions.voice.flow import FlowRunner
from omnilive.engines.minicpmo.sessions.voice.vocoder import (
    VOCODER_CHUNK,
    ChunkRunner,
    ModelCodeRunner,
    VoiceStream,
    voice_together,
)

SPEECH_TOKENS = 6561
WARM_CHUNKS = 3


def load_vocoder(folder: Path) -> object:
    """minicpmo-utils' Token2wav with random weights (the benchmark stand-in)."""
    package = folder / "stepaudio2"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copy2(STANDINS / "random_vocoder.py", package / "__init__.py")
    (folder / "librosa").mkdir(exist_ok=True)  # as in the benchmark checkpoint
    shutil.copy2(STANDINS / "librosa_stub.py", folder / "librosa" / "__init__.py")
    sys.path.insert(0, str(folder))
    from stepaudio2 import Token2wav  # the stand-in, over the installed package

    return Token2wav(str(folder))


def voice_session(
    runner: ChunkRunner, prompt_wav: str, tokens: list[list[int]], seed: int
) -> tuple[VoiceStream, list[np.ndarray], list[float]]:
    """A fresh voice and what each push of ``tokens`` makes, with its ms."""
    voice = VoiceStream(runner, prompt_wav)
    pushed = [push(voice, chunk, seed, k) for k, chunk in enumerate(tokens)]
    return voice, [audio for audio, _ in pushed], [ms for _, ms in pushed]


def push(voice: VoiceStream, chunk: list[int], seed: int, k: int) -> tuple[np.ndarray, float]:
    torch.manual_seed(seed * 1000 + k)
    torch.cuda.synchronize()
    started = time.perf_counter()
    audio = voice.push(chunk, last=False, flush=False)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - started) * 1000
    return (audio if audio is not None else np.zeros(0, np.float32)), elapsed


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=12)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    folder = Path(tempfile.mkdtemp(prefix="vocoder-"))
    vocoder = load_vocoder(folder)
    prompt = folder / "voice.wav"
    prompt.write_bytes(wav_bytes(synthetic_voice(), 16000))
    rng = np.random.default_rng(0)
    scripts = [
        [rng.integers(0, SPEECH_TOKENS, VOCODER_CHUNK).tolist() for _ in range(args.chunks)]
        for _ in range(args.sessions)
    ]
    variants: dict[str, ChunkRunner] = {
        "model_code": ModelCodeRunner(vocoder),
        "flow_eager": FlowRunner(vocoder, graphs=False),
        "flow_graphs": FlowRunner(vocoder, graphs=True),
    }
    audio: dict[str, list[np.ndarray]] = {}
    result: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "chunks": args.chunks}
    for name, runner in variants.items():
        _, made, ms = voice_session(runner, str(prompt), scripts[0], seed=0)
        audio[name] = list(made)
        steady = ms[WARM_CHUNKS:] or ms
        result[f"{name}_chunk_ms_p50"] = round(statistics.median(steady), 2)
        result[f"{name}_first_chunks_ms"] = [round(x, 1) for x in ms[:WARM_CHUNKS]]
        print(f"{name}: {statistics.median(steady):.1f} ms a chunk (first {ms[:3]})", flush=True)
    for name in ("flow_eager", "flow_graphs"):
        result[f"{name}_vs_model_code"] = largest_difference(audio[name], audio["model_code"])
    # Sessions interleaved on one runner (graphs shared), each against itself alone.
    runner = variants["flow_graphs"]
    alone = [voice_session(runner, str(prompt), script, seed=s)[1] for s, script in
             enumerate(scripts)]  # fmt: skip
    voices = [VoiceStream(runner, str(prompt)) for _ in scripts]
    together: list[list[np.ndarray]] = [[] for _ in scripts]
    rounds = []
    for k in range(args.chunks):
        started = time.perf_counter()
        for s, voice in enumerate(voices):
            together[s].append(push(voice, scripts[s][k], s, k)[0])
        rounds.append((time.perf_counter() - started) * 1000)
    result["sessions"] = args.sessions
    result["interleaved_vs_alone"] = max(
        largest_difference(list(alone[s]), together[s]) for s in range(args.sessions)
    )
    result["interleaved_round_ms_p50"] = round(statistics.median(rounds[WARM_CHUNKS:]), 1)
    # The same sessions' pushes voiced together: one flow batch a round.
    voices = [VoiceStream(runner, str(prompt)) for _ in scripts]
    batched: list[list[np.ndarray]] = [[] for _ in scripts]
    rounds = []
    for k in range(args.chunks):
        torch.cuda.synchronize()
        started = time.perf_counter()
        made = voice_together(runner, [(voice, scripts[s][k], False, False) for s, voice in
                                       enumerate(voices)])  # fmt: skip
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - started) * 1000)
        for s, audio in enumerate(made):
            batched[s].append(audio if audio is not None else np.zeros(0, np.float32))
    # HiFT draws its excitation's noise per row: a batch draws other numbers.
    result["together_vs_alone"] = max(
        largest_difference(list(alone[s]), batched[s]) for s in range(args.sessions)
    )
    result["together_round_ms_p50"] = round(statistics.median(rounds[WARM_CHUNKS:]), 1)
    result["together_first_rounds_ms"] = [round(x, 1) for x in rounds[:WARM_CHUNKS]]
    result["flow_batch_sizes"] = dict(sorted(runner.batch_sizes.items()))
    result["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(result, indent=2), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
