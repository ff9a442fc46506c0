"""How fast the embedded cascade answers a spoken question, end to end.

Starts ``omnilive serve --engine cascade`` on free ports, opens one half-duplex
session and plays spoken questions (1.9–3.5 s each, spoken by the cascade's
Piper voice without its random variation, or espeak-ng with ``--speaker
espeak``) at real-time pace, the way a microphone delivers them: the chunk
holding audio [k·c, (k+1)·c) is sent at t0 + (k+1)·c. The client stops
sending while the answer is generated and resumes after it, as the spec prescribes.

With ``--end-of-turn both`` (the default) it runs twice in one invocation,
with the semantic end-of-turn model and with the silence rule alone, and also
plays turns with a mid-sentence pause of 0.5–1.0 s ("I would like to book a
table for… four people tonight", spoken with a comma and the pause
stretched): a turn the server ends before the speaker finished is a
premature cut-in.

For each question it records, relative to the moment the speech ended:
  vad_ms      when the server said the user stopped (``vad_state{speaking:false}``)
  e2e_ms      when the first audio byte of the answer arrived
and the engine's own stage timings from ``turn_done.timings`` (ASR, LLM first
sentence, TTS of the first sentence; from the moment the server heard the
pause, the early answer's wait behind a transcript in flight and its first
audio made). It prints median and p90 (over the questions not cut
in on) and saves everything as JSON under benchmarks/results/.

    python -m benchmarks.cascade_latency [--chunk-s 0.1] [--min-silence-ms 800]
        [--end-of-turn both|on|off] [--speaker piper|espeak]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from tests.speech import longest_pause, silence, speak, speak_piper
from websockets.asyncio.client import connect

from benchmarks.load import this_machine
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
# Turns with a pause where the comma is (stretched to 0.5-1.0 s): not finished there.
PAUSED_TURNS = [
    "I would like to book a table for, four people tonight.",
    "Can you tell me about the, history of Rome?",
    "I need to buy some, milk and bread for breakfast.",
    "What do you think about, the new movie with the robots?",
    "Could you please remind me to, call my mother tomorrow?",
    "My favourite colour is, dark blue like the sea.",
    "I was wondering if, you could help me with my homework.",
    "The weather today is, really nice for a walk.",
    "Please set an alarm for, seven in the morning.",
    "I want to learn how to, play the guitar this year.",
]
RESULTS = Path(__file__).parent / "results"


def speaker(name: str) -> Any:
    return speak_piper if name == "piper" else speak


def with_pause(speech: np.ndarray, pause_s: float) -> np.ndarray:
    """``speech`` with its longest inner pause stretched to ``pause_s``."""
    start, end = longest_pause(speech)
    return np.concatenate([speech[:start], silence(pause_s), speech[end:]])


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1) if values else float("nan"),
        "p90": round(percentile(values, 90), 1),
        "n": len(values),
    }


async def ask(ws: Any, mic: Microphone, question: str, speech: np.ndarray) -> dict[str, Any]:
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
        # From the server hearing the pause: the early answer's wait for a
        # transcript in flight, and its first audio made.
        "early_queue_ms": timings.get("early_queue_ms"),
        "judge_ms": timings.get("judge_ms"),
        "words_end_p": timings.get("words_end_p"),
        "judged_tokens": timings.get("judged_tokens"),
        "early_audio_ms": timings.get("early_audio_ms"),
        # The server ended the turn before the speech did: a premature cut-in.
        "premature": turn.vad_ms < 0,
    }


async def run(args: argparse.Namespace, end_of_turn: bool) -> dict[str, Any]:
    say = speaker(args.speaker)
    questions = [(q, say(q)) for q in QUESTIONS[: args.questions]]
    span = max(1, len(PAUSED_TURNS) - 1)
    paused = [(t, with_pause(say(t), 0.5 + 0.5 * i / span)) for i, t in enumerate(PAUSED_TURNS)]
    env = {
        "OMNILIVE_END_OF_TURN__ENABLED": "true" if end_of_turn else "false",
        "OMNILIVE_END_OF_TURN__UNFINISHED_WAIT_MS": str(args.unfinished_wait_ms),
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), engine="cascade", env=env).start()
        try:
            await server.wait_ready(timeout=300, workers=1)
            url = f"{server.ws}/ws/half_duplex/bench_{os.getpid()}"
            async with connect(url, max_size=None) as ws:
                while json.loads(await ws.recv())["type"] != "queue_done":
                    pass
                # Unset, the rule is the server's (end_of_turn.unfinished_wait_ms).
                vad = (
                    {}
                    if args.min_silence_ms is None
                    else {"min_silence_duration_ms": args.min_silence_ms}
                )
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
                rows, paused_rows = [], []
                for question, speech in questions:
                    row = await ask(ws, mic, question, speech)
                    rows.append(row)
                    print(
                        f"{row['speech_s']:4.1f} s  vad {row['vad_ms']:6.0f}  "
                        f"e2e {row['e2e_ms']:6.0f} ms  asr {row['asr_ms']}  "
                        f"llm {row['llm_first_sentence_ms']}  tts {row['tts_first_sentence_ms']}  "
                        f"{'spec' if row['speculative'] else '    '}  {row['question']}"
                    )
                    await asyncio.sleep(0.8)  # the spec's pause after playback
                for turn, speech in paused[: args.paused]:
                    row = await ask(ws, mic, turn, speech)
                    paused_rows.append(row)
                    cut = "CUT " if row["premature"] else "    "
                    print(f"{cut}vad {row['vad_ms']:6.0f}  e2e {row['e2e_ms']:6.0f} ms  {turn}")
                    await asyncio.sleep(0.8)
                await ws.send(json.dumps({"type": "stop"}))
        finally:
            server.stop()

    def column(name: str) -> list[float]:
        """A stage's values over the questions answered after they ended: a
        premature cut-in's negative latency (counted on its own) would pull
        the median down a whole place."""
        answered = [r for r in rows if not r["premature"]]
        return [r[name] for r in answered if isinstance(r[name], int | float)]

    return {
        "benchmark": "cascade_latency",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": this_machine(),
        "config": {
            "chunk_s": args.chunk_s,
            "min_silence_duration_ms": args.min_silence_ms,
            "end_of_turn": end_of_turn,
            "unfinished_wait_ms": args.unfinished_wait_ms,
            "speaker": args.speaker,
        },
        "summary_ms": {
            "vad_end_of_speech": summary(column("vad_ms")),
            "asr": summary(column("asr_ms")),
            "llm_first_sentence": summary(column("llm_first_sentence_ms")),
            "tts_first_audio": summary(column("tts_first_sentence_ms")),
            "pause_heard_to_audio_made": summary(column("early_audio_ms")),
            "early_queue": summary(column("early_queue_ms")),
            "judge": summary(column("judge_ms")),
            "end_to_end": summary(column("e2e_ms")),
        },
        "speculative_turns": sum(r["speculative"] for r in rows),
        "premature_cut_ins": {
            "questions": sum(r["premature"] for r in rows),
            "paused_turns": sum(r["premature"] for r in paused_rows),
            "of_paused_turns": len(paused_rows),
        },
        "rows": rows,
        "paused_rows": paused_rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunk-s", type=float, default=0.1, help="client chunk length")
    parser.add_argument(
        "--min-silence-ms",
        type=int,
        help="the client's VAD end-of-speech rule (default: none set, the server's: 800 ms, "
        "up to end_of_turn.unfinished_wait_ms for words judged unfinished)",
    )
    parser.add_argument("--questions", type=int, default=len(QUESTIONS))
    parser.add_argument("--paused", type=int, default=len(PAUSED_TURNS))
    parser.add_argument("--end-of-turn", choices=["both", "on", "off"], default="both")
    parser.add_argument("--speaker", choices=["piper", "espeak"], default="piper")
    parser.add_argument(
        "--unfinished-wait-ms",
        type=int,
        default=1600,
        help="the server's end_of_turn.unfinished_wait_ms (default: the server's, 1600; 0: off)",
    )
    parser.add_argument("--out", type=Path, help="result file (default: benchmarks/results/...)")
    args = parser.parse_args()
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.end_of_turn]
    runs = {("end_of_turn" if mode else "silence_rule"): asyncio.run(run(args, mode))
            for mode in modes}  # fmt: skip
    for name, result in runs.items():
        print(name, json.dumps(result["summary_ms"]["end_to_end"]),
              json.dumps(result["premature_cut_ins"]))  # fmt: skip
    rule = "-server" if args.min_silence_ms is None else f"{args.min_silence_ms}ms"
    out = args.out or RESULTS / (
        f"cascade_latency_chunk{args.chunk_s:g}s_silence{rule}_{args.end_of_turn}_{args.speaker}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
