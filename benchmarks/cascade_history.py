"""Does the cascade's language model answer on over a long conversation, by
how much history its prompt keeps (``cascade.llm.history_messages``)?

The packaged SmolLM2-135M, loaded as the engine loads it, is asked the
benchmark's questions in a cycle for ``--turns`` turns, as text (no speech:
the transcripts are the questions), each prompt fitted by the spoken
sessions' own :class:`~omnilive.engines.cascade.conversation.Conversation`
with each cap of ``--caps`` (0: as much as the context takes), sampling as a
session does. Counted over the last 20 answers: how many are distinct
(their first 40 characters), and over all turns how many answers began as
the one before did (an answer copied from the history instead of made for
the question). Saves ``benchmarks/results/cascade_history.json``.

    python -m benchmarks.cascade_history [--caps 0,12,4] [--turns 50]
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cascade_latency import QUESTIONS
from benchmarks.load import save_result, this_machine
from omnilive.engine_settings import CascadeSettings
from omnilive.engines.cascade.engine import CascadeEngine
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.stack import ModelStack, spoken_conversation
from omnilive.engines.messages import GenerationOptions

SYSTEM = "You are a helpful assistant on the phone. Answer in one short sentence."
HEAD = 40  # characters that tell two answers apart


def conversation(stack: ModelStack, cap: int, turns: int) -> list[str]:
    options = GenerationOptions()
    budget = stack.llm.n_ctx - stack.spoken_budget(options)
    history = spoken_conversation(SYSTEM, cap)
    answers: list[str] = []
    for index in range(turns):
        question = Message("user", QUESTIONS[index % len(QUESTIONS)])
        fit = history.fit(stack.llm.count, budget, question)
        history.commit(fit, question)
        prompt = stack.llm.tokens(fit.messages, None)
        answer = stack.answer(prompt, options, stack.spoken_budget(options), None)
        for _ in answer:
            pass
        answers.append(answer.text.strip())
        history.add("assistant", answers[-1])
    return answers


def figures(answers: list[str]) -> dict[str, Any]:
    heads = [answer[:HEAD] for answer in answers]
    return {
        "distinct_of_last_20": len(set(heads[-20:])),
        "copied_from_the_one_before": sum(a == b for a, b in itertools.pairwise(heads)),
        "last_answers": answers[-6:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caps", default="0,12,4")
    parser.add_argument("--turns", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        engine = CascadeEngine(CascadeSettings(), Path(data))
        engine.load(lambda stage, fraction: None)
        stack = engine._stack
        assert stack is not None
        rows = {}
        for cap in (int(c) for c in args.caps.split(",")):
            started = time.monotonic()
            rows[str(cap)] = {
                **figures(conversation(stack, cap, args.turns)),
                "seconds": round(time.monotonic() - started),
            }
            shown = {k: v for k, v in rows[str(cap)].items() if k != "last_answers"}
            print(f"history_messages {cap}: {shown}", flush=True)
        engine.close()
    save_result("cascade_history", {"machine": this_machine(), "turns": args.turns, "caps": rows})


if __name__ == "__main__":
    main()
