"""Turn-taking of the embedded cascade on voices it was not tuned to.

``cascade_latency`` speaks its questions with the cascade's own Piper voice
(or espeak-ng's en-us), on which the end-of-turn rules were tuned. This one
speaks held-out questions and held-out paused turns (none of them in
``cascade_latency``'s sets) with several other espeak-ng voices, at
microphone pace in 0.1 s chunks, one half-duplex session per voice, with
the server's own silence rule (the client sets none, so a turn whose words
sound unfinished may wait up to ``end_of_turn.unfinished_wait_ms``).

For each finished question: ``vad_ms`` (the server's end of speech, from the
end of the audio) and ``e2e_ms`` (the answer's first audio), with the words
the server heard (``turn_done.transcript`` where the engine says it) and its
``judge_ms``; a question whose end came after ``--waited-ms`` is counted as
*waited* (held by the patience for unfinished words). For each paused turn:
whether the server ended it at its pause (a cut-in). It prints p50 / p90 of
``e2e_ms`` per voice and over all, the waits and the cut-ins, and saves it
all as JSON under benchmarks/results/.

    python -m benchmarks.cascade_heldout [--voices en-gb,en-gb-scotland,en-029,en-us+f3]
        [--questions 5] [--paused 5] [--tag NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.servers import Server
from tests.speech import silence, speak
from websockets.asyncio.client import connect

from benchmarks.cascade_latency import RESULTS, ask, summary, with_pause
from benchmarks.load import this_machine
from benchmarks.microphone import Microphone

VOICES = ["en-gb", "en-gb-scotland", "en-029", "en-us+f3"]
# Finished questions, none of them in cascade_latency's sets.
QUESTIONS = [
    "How far away is the sun from the earth?",
    "What should I cook for dinner tonight?",
    "Why is the sky blue during the day?",
    "Can you suggest a good movie for a rainy evening?",
    "What time is it in Tokyo right now?",
    "How many legs does a spider have?",
    "Where is the best place to watch the sunset?",
    "Could you help me write a short poem about autumn?",
    "What does a honey bee do all day long?",
    "How do I keep my houseplants alive in winter?",
    "Is it healthy to drink coffee every morning?",
    "What is the capital city of Australia?",
    "Tell me a joke about elephants.",
    "How long does it take to boil an egg?",
    "Which planet has the most moons?",
    "What is a nice gift for my grandfather?",
    "Why do leaves change colour in the autumn?",
    "How can I sleep better at night?",
    "What is the fastest animal on land?",
    "Do you know any good exercises for my back?",
]
# Turns with a pause at the comma (stretched to 0.6-1.0 s): not finished there.
PAUSED = [
    "I think I would like to, order a pizza for dinner.",
    "Could you tell me how to, get to the train station?",
    "My brother is coming to visit, next weekend with his kids.",
    "I am looking for a recipe, with chicken and rice.",
    "Do you remember the name of, that song from yesterday?",
    "We should plan a trip to, the mountains this summer.",
    "Can you explain why, the moon changes its shape?",
    "I forgot to buy, eggs and butter at the shop.",
]
RESULTS_NAME = "cascade_heldout"


async def one_voice(server: Server, voice: str, args: argparse.Namespace) -> dict[str, Any]:
    questions = [(q, speak(q, voice)) for q in QUESTIONS[: args.questions]]
    span = max(1, args.paused - 1)
    paused = [
        (t, with_pause(speak(t, voice), 0.6 + 0.4 * i / span))
        for i, t in enumerate(PAUSED[: args.paused])
    ]
    url = f"{server.ws}/ws/half_duplex/heldout_{os.getpid()}_{voice.replace('+', '_')}"
    rows, paused_rows = [], []
    async with connect(url, max_size=None) as ws:
        while json.loads(await ws.recv())["type"] != "queue_done":
            pass
        prepare = {
            "type": "prepare",
            "system_prompt": "You are a helpful assistant. Answer in one short sentence.",
            "config": {},  # the server's silence rule
        }
        await ws.send(json.dumps(prepare))
        while json.loads(await ws.recv())["type"] != "prepared":
            pass
        mic = Microphone(ws, args.chunk_s)
        await mic.play(silence(0.6))  # past the 0.5 s cold-start guard
        for question, speech in questions:
            row = await ask(ws, mic, question, speech)
            row["voice"] = voice
            row["waited"] = not row["premature"] and row["vad_ms"] > args.waited_ms
            rows.append(row)
            mark = "CUT " if row["premature"] else ("WAIT" if row["waited"] else "    ")
            print(f"{voice:15s} {mark} vad {row['vad_ms']:6.0f}  e2e {row['e2e_ms']:6.0f} ms  "
                  f"words {row['words_end_p']}  {question}")  # fmt: skip
            await asyncio.sleep(0.8)
        for turn, speech in paused:
            row = await ask(ws, mic, turn, speech)
            row["voice"] = voice
            paused_rows.append(row)
            cut = "CUT " if row["premature"] else "    "
            print(f"{voice:15s} {cut} vad {row['vad_ms']:6.0f}  e2e {row['e2e_ms']:6.0f} ms  "
                  f"{turn}")  # fmt: skip
            await asyncio.sleep(0.8)
        await ws.send(json.dumps({"type": "stop"}))
    return {"rows": rows, "paused_rows": paused_rows}


def figures(rows: list[dict[str, Any]], paused_rows: list[dict[str, Any]]) -> dict[str, Any]:
    answered = [r for r in rows if not r["premature"]]
    return {
        "end_to_end_ms": summary([r["e2e_ms"] for r in answered]),
        "vad_end_of_speech_ms": summary([r["vad_ms"] for r in answered]),
        "waited": sum(r["waited"] for r in rows),
        "questions": len(rows),
        "questions_cut_in_on": sum(r["premature"] for r in rows),
        "paused_turns_cut": sum(r["premature"] for r in paused_rows),
        "paused_turns": len(paused_rows),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {"OMNILIVE_END_OF_TURN__ENABLED": "true"}
    per_voice: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), engine="cascade", env=env).start()
        try:
            await server.wait_ready(timeout=300, workers=1)
            for voice in args.voices:
                per_voice[voice] = await one_voice(server, voice, args)
        finally:
            server.stop()
            if args.log is not None:
                shutil.copyfile(server.log_path, args.log)
    rows = [r for v in per_voice.values() for r in v["rows"]]
    paused_rows = [r for v in per_voice.values() for r in v["paused_rows"]]
    return {
        "benchmark": RESULTS_NAME,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": this_machine(),
        "load_average": os.getloadavg(),
        "config": {
            "chunk_s": args.chunk_s,
            "voices": args.voices,
            "questions_per_voice": args.questions,
            "paused_per_voice": args.paused,
            "waited_ms": args.waited_ms,
            "tag": args.tag,
        },
        "summary": figures(rows, paused_rows),
        "by_voice": {v: figures(r["rows"], r["paused_rows"]) for v, r in per_voice.items()},
        "rows": rows,
        "paused_rows": paused_rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voices", type=lambda s: s.split(","), default=VOICES)
    parser.add_argument("--questions", type=int, default=5, help="finished questions per voice")
    parser.add_argument("--paused", type=int, default=5, help="paused turns per voice")
    parser.add_argument("--chunk-s", type=float, default=0.1, help="client chunk length")
    parser.add_argument(
        "--waited-ms", type=float, default=1000, help="an end of speech later than this: waited"
    )
    parser.add_argument("--tag", default="", help="added to the result file's name")
    parser.add_argument("--log", type=Path, help="keep the server's log here")
    parser.add_argument("--out", type=Path, help="result file (default: benchmarks/results/...)")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print("all", json.dumps(result["summary"]))
    for voice, shown in result["by_voice"].items():
        print(voice, json.dumps(shown))
    suffix = f"_{args.tag}" if args.tag else ""
    out = args.out or RESULTS / f"{RESULTS_NAME}_chunk{args.chunk_s:g}s{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
