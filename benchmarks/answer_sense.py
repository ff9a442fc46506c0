"""Does the embedded cascade answer everyday questions sensibly?

The 14 spoken questions of ``cascade_latency.py`` go, as text, through the
prompt a half-duplex session gives the packaged SmolLM2-135M (the spoken
system prompt, the answer budget, the session's default sampling), and each
answer is checked for a keyword a sensible answer would hold. The checks were
written before the prompt was tuned and are kept as they were; they are
crude (a sensible answer may miss them, a wrong one may hit them), and the
printed answers are there to be read. Each question is asked ``--runs``
times (answers are sampled); a question counts as answered sensibly when
most of its runs pass. Results go to benchmarks/results/answer_sense.json.

    python -m benchmarks.answer_sense [--runs 3] [--name answer_sense]
    python -m benchmarks.answer_sense --rescore benchmarks/results/answer_sense.json
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cascade_latency import QUESTIONS
from benchmarks.load import save_result

# One list of words per question (in QUESTIONS' order): any of them counts.
KEYWORDS: list[list[str]] = [
    ["earth", "orbit", "gravity", "crater", "tide", "phase", "astronaut", "apollo", "armstrong",
     "384", "238,000", "quarter", "dust", "rock", "same side", "far side"],
    ["practice", "speak", "conversation", "immers", "lesson", "class", "app", "daily",
     "every day", "native", "read", "listen", "vocabulary", "words"],
    ["whale"],
    ["\"", "shadow", "midnight", "luna", "salem", "onyx", "raven", "jet", "ebony", "coal",
     "pepper", "smok", "panther", "noir", "licorice", "ink", "oreo", "ninja", "boots", "bella",
     "max", "charlie", "leo", "milo", "blackie", "sooty", "kitty", "whiskers", "felix"],
    [" by ", "\"", "novel", "mockingbird", "gatsby", "potter", "pride and prejudice", "1984",
     "orwell", "hobbit", "alchemist", "tolkien", "austen"],
    ["71", "70", "percent", "%", "deep", "mariana", "species", "coral", "salt", "whale", "fish",
     "unexplored", "explored", "cover"],
    ["rain", "mild", "cool", "wet", "shower", "degree", "cloud", "warm", "sun"],
    ["lift", "wing", "pressure", "thrust", "bernoulli"],
    ["everest"],
    ["gravity", "light", "escape", "collapse", "dense", "mass", "pull"],
    ["oat", "fruit", "egg", "yogurt", "yoghurt", "banana", "berr", "toast", "whole grain",
     "cereal", "porridge", "nut", "avocado", "apple"],
    ["energy", "hunt", "nocturnal", "predator", "conserve", "dawn", "dusk", "crepuscular"],
    ["clothes", "clothing", "shoe", "passport", "jacket", "umbrella", "adapter", "comfortable",
     "layers", "yen", "cash", "camera"],
    ["book", "flower", "gift card", "jewel", "necklace", "candle", "chocolate", "perfume",
     "scarf", "dinner", "plant", "mug", "bag", "watch", "cake", "bracelet"],
]  # fmt: skip


def sensible(answer: str, keywords: list[str]) -> bool:
    text = " " + re.sub(r"\s+", " ", answer.lower()) + " "
    return any(word in text for word in keywords)


def ask(stack: Any, question: str) -> tuple[str, float]:
    """The answer a half-duplex session's prompt gets from the language model."""
    from omnilive.engines.cascade.llm import Message
    from omnilive.engines.cascade.stack import spoken_conversation
    from omnilive.engines.messages import GenerationOptions

    options = GenerationOptions()  # the session default, as a client that sets none
    conversation = spoken_conversation("")
    prompt = stack.llm.tokens(conversation.messages(Message("user", question)))
    started = time.perf_counter()
    stream = stack.answer(prompt, options, stack.spoken_budget(options), voice=None)
    for _ in stream:  # text only (no voice): the answer as a session's model writes it
        pass
    return stream.text.strip(), (time.perf_counter() - started) * 1000


def rescore(path: Path) -> None:
    """Check a saved run's answers again (after a check changed)."""
    result = json.loads(path.read_text())
    for row, keywords in zip(result["rows"], KEYWORDS, strict=True):
        row["passed"] = [sensible(answer, keywords) for answer in row["answers"]]
        row["sensible"] = sum(row["passed"]) * 2 > len(row["passed"])
    result["sensible"] = sum(row["sensible"] for row in result["rows"])
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{path}: sensible {result['sensible']} of {len(result['rows'])}")


def main() -> None:
    from omnilive.engine_settings import CascadeSettings
    from omnilive.engines.cascade import CascadeEngine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--name", default="answer_sense")
    parser.add_argument("--rescore", type=Path, help="check a saved result's answers again")
    args = parser.parse_args()
    assert len(KEYWORDS) == len(QUESTIONS)
    if args.rescore is not None:
        rescore(args.rescore)
        return
    with tempfile.TemporaryDirectory() as data:
        engine = CascadeEngine(CascadeSettings(tts="espeak"), Path(data))
        engine.load(lambda stage, fraction: None)
        rows = []
        for question, keywords in zip(QUESTIONS, KEYWORDS, strict=True):
            runs = [ask(engine.stack, question) for _ in range(args.runs)]
            passed = [sensible(answer, keywords) for answer, _ in runs]
            rows.append({
                "question": question,
                "answers": [answer for answer, _ in runs],
                "passed": passed,
                "sensible": sum(passed) * 2 > len(passed),
                "ms": [round(ms) for _, ms in runs],
            })  # fmt: skip
            mark = "ok " if rows[-1]["sensible"] else "-- "
            print(f"{mark}{question}\n    {runs[0][0]!r}")
        engine.close()
    score = sum(row["sensible"] for row in rows)
    print(f"sensible: {score} of {len(rows)} ({args.runs} runs each, majority)")
    result = {
        "benchmark": "answer_sense",
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpu": platform.processor() or platform.machine()},
        "runs": args.runs,
        "sensible": score,
        "questions": len(rows),
        "rows": rows,
    }
    save_result(args.name, result)


if __name__ == "__main__":
    main()
