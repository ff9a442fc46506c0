"""How fast the embedded cascade answers a spoken question, end to end.

Starts ``omnilive serve --engine cascade`` on free ports, opens one half-duplex
session and plays spoken questions (made with espeak-ng, 2–5 s each) at
real-time pace, the way a microphone delivers them: the chunk holding audio
[k·c, (k+1)·c) is sent at t0 + (k+1)·c. The client stops sending while the
answer is generated and resumes after it, as the spec prescribes.

For each question it records, relative to the moment the speech ended:
  vad_ms      when the server said the user stopped (``vad_state{speaking:false}``)
  e2e_ms      when the first audio byte of the answer arrived
and the engine's own stage timings from ``turn_done.timings`` (ASR, LLM first
sentence, TTS of the first sentence). It prints median and p90 and saves
everything as JSON under benchmarks/results/.

    python -m benchmarks.cascade_latency [--chunk-s 0.1] [--min-silence-ms 800]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from tests.speech import silence, speak
from websockets.asyncio.client import connect

from benchmarks.microphone import RATE, Microphone, spoken_turn

QUESTIONS = [
    "Can you tell me a fun fact about the moon?",
    "What is the best way to learn a new language?",
    "Which animal is the largest on our planet?",
    "What is a good name for a small black cat?",
    "Could you recommend a good book to read this weekend?",
    "Tell me something interesting about the ocean.",
    "What is the weather usually like in London in the spring?",
    "How do airplanes manage to stay up in the air?",
    "What is the tallest mountain in the whole world?",
    "Can you explain what a black hole is in simple words?",
    "What are some healthy things to eat for breakfast?",
    "Why do cats like to sleep so much during the day?",
    "I am planning a trip to Japan next month, what should I pack for it?",
    "My friend has a birthday on Saturday, what present do you think she would like?",
]
RESULTS = Path(__file__).parent / "results"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1) if values else float("nan"),
        "p90": round(percentile(values, 90), 1),
        "n": len(values),
    }


async def ask(ws: Any, mic: Microphone, question: str) -> dict[str, Any]:
    speech = speak(question)
    turn = await spoken_turn(ws, mic, speech)
    timings = turn.done.get("timings", {})
    return {
        "question": question,
        "speech_s": round(speech.size / RATE, 2),
        "answer": turn.done.get("text", ""),
        "vad_ms": turn.vad_ms,
        "e2e_ms": turn.first_audio_ms,
        "asr_ms": timings.get("asr_ms"),
        "llm_first_sentence_ms": timings.get("llm_first_sentence_ms"),
        "tts_first_sentence_ms": timings.get("tts_first_sentence_ms"),
        "speculative": bool(timings.get("speculative")),
        "server_first_chunk_ms": timings.get("first_chunk_ms"),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    questions = [q for q in QUESTIONS if 2.0 <= speak(q).size / RATE <= 5.0]
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), engine="cascade").start()
        try:
            await server.wait_ready(timeout=300, workers=1)
            url = f"{server.ws}/ws/half_duplex/bench_{os.getpid()}"
            async with connect(url, max_size=None) as ws:
                while json.loads(await ws.recv())["type"] != "queue_done":
                    pass
                vad = {"min_silence_duration_ms": args.min_silence_ms}
                prepare = {
                    "type": "prepare",
                    "system_prompt": "You are a helpful assistant. Answer in one short sentence.",
                    "config": {"vad": vad},
                }
                await ws.send(json.dumps(prepare))
                while json.loads(await ws.recv())["type"] != "prepared":
                    pass
                mic = Microphone(ws, args.chunk_s)
                await mic.play(silence(0.6))  # past the 0.5 s cold-start guard
                rows = []
                for question in questions[: args.questions]:
                    row = await ask(ws, mic, question)
                    rows.append(row)
                    print(
                        f"{row['speech_s']:4.1f} s  vad {row['vad_ms']:6.0f}  "
                        f"e2e {row['e2e_ms']:6.0f} ms  asr {row['asr_ms']}  "
                        f"llm {row['llm_first_sentence_ms']}  tts {row['tts_first_sentence_ms']}  "
                        f"{'spec' if row['speculative'] else '    '}  {row['question']}"
                    )
                    await asyncio.sleep(0.8)  # the spec's pause after playback
                await ws.send(json.dumps({"type": "stop"}))
        finally:
            server.stop()

    def column(name: str) -> list[float]:
        return [r[name] for r in rows if isinstance(r[name], int | float)]

    return {
        "benchmark": "cascade_latency",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "config": {"chunk_s": args.chunk_s, "min_silence_duration_ms": args.min_silence_ms},
        "summary_ms": {
            "vad_end_of_speech": summary(column("vad_ms")),
            "asr": summary(column("asr_ms")),
            "llm_first_sentence": summary(column("llm_first_sentence_ms")),
            "tts_first_audio": summary(column("tts_first_sentence_ms")),
            "end_to_end": summary(column("e2e_ms")),
        },
        "speculative_turns": sum(r["speculative"] for r in rows),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunk-s", type=float, default=0.1, help="client chunk length")
    parser.add_argument("--min-silence-ms", type=int, default=800, help="VAD end-of-speech rule")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS))
    parser.add_argument("--out", type=Path, help="result file (default: benchmarks/results/...)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result["summary_ms"], indent=2))
    out = args.out or RESULTS / (
        f"cascade_latency_chunk{args.chunk_s:g}s_silence{args.min_silence_ms}ms.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
