"""The cascade's end-of-turn judges at every pause, offline, and the rules
that could decide from them: figures that do not depend on how loaded the
machine is (``cascade_heldout`` measures the same turns live).

Each held-out question and paused turn of ``cascade_heldout``, spoken by each
of its espeak-ng voices, goes through a session's own VAD (the server's
silence rule, the worker's end-of-turn checks for an engine that judges
words) in 0.1 s chunks, the turn never ended: at every check the VAD offers
(a pause between two words as much as the end), the cascade's words
judgement (its transcript and the language model's chance that the words
end the message: ``words_p``, the early answer's own) and Smart Turn's
chance that the sound is a finished turn (``audio_p``) are recorded, with
the words' two readings (``words_readings``: bare and as heard, see
``LlamaChat.end_probability``). Each turn is judged with no conversation
before it, unlike a session's later turns.

Then each rule is replayed on those checks as the runner applies one: the
turn ends at the first check the rule finds finished (a sound-only verdict
needs ``confirmations`` in a row in one pause), else at the end of the
silence the rule waits for (``unfinished_wait_ms`` once words were judged
unfinished, else the 800 ms rule). A question's *delay* is the silence after
its end when the turn ended; a turn ended at a pause inside the speech is a
cut-in (for a paused turn: cut at its pause). Printed and saved under
benchmarks/results/.

    python -m benchmarks.turn_verdicts [--voices ...] [--questions 20] [--paused 8]
    python -m benchmarks.turn_verdicts --replay benchmarks/results/turn_verdicts.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tests.speech import silence, speak

from benchmarks.cascade_heldout import PAUSED, QUESTIONS, VOICES
from benchmarks.cascade_latency import RESULTS, percentile, with_pause
from benchmarks.load import this_machine

RATE = 16_000
LEAD_S, TAIL_S, CHUNK_S = 0.8, 2.5, 0.1  # as cascade_heldout plays a turn
JUDGED_WAIT_S = 120.0  # offline: a judgement is awaited, however slow the machine
RULE_MS, PATIENCE_MS = 800, 1600  # the server's silence rule, and its patience
# A check whose pause begins this close to the end of the speech is at its end
# (the VAD hears a trailing consonant's tail as silence a little early).
END_SLACK_MS = 150


def server_vad_config() -> Any:
    """The VAD of a half-duplex session whose client sets no silence rule,
    with the worker's end-of-turn checks (``runners/hearing.with_turn_checks``)
    for an engine that judges words."""
    import asyncio
    from types import SimpleNamespace

    from omnilive.end_of_turn import TurnJudge
    from omnilive.session_settings import EndOfTurnSettings
    from omnilive.vad import VadConfig
    from omnilive.worker.runners.hearing import with_turn_checks

    runtime = SimpleNamespace(turn_judge=TurnJudge(EndOfTurnSettings()))
    return asyncio.run(with_turn_checks(runtime, VadConfig(), True, True))  # type: ignore[arg-type]


def checks_of(
    speech: np.ndarray, config: Any, judge: Callable[[np.ndarray], dict[str, Any]]
) -> tuple[list[dict[str, Any]], float]:
    """Every check the VAD offers while ``speech`` plays (none ends the turn),
    with ``judge``'s figures; and where the speech ends (ms of the audio)."""
    from omnilive.vad import SileroModel, StreamingVad, TurnCheck

    vad = StreamingVad(SileroModel(), config)
    audio = np.concatenate([silence(0.6 + LEAD_S), speech, silence(TAIL_S)]).astype(np.float32)
    speech_end_ms = 1000 * (0.6 + LEAD_S) + 1000 * speech.size / RATE
    step = round(CHUNK_S * RATE)
    checks = []
    for start in range(0, audio.size, step):
        for event in vad.feed(audio[start : start + step]):
            if isinstance(event, TurnCheck):
                pause_ms = 1000 * event.pause / RATE
                checks.append(
                    {
                        "pause_ms": round(pause_ms),  # where its silence began
                        "round": event.round,
                        "silence_ms": round(event.silence_ms),
                        "at_end": pause_ms >= speech_end_ms - END_SLACK_MS,
                        **judge(event.speech),
                    }
                )
    return checks, speech_end_ms


def engine_judge(session: Any, turn_judge: Any) -> Callable[[np.ndarray], dict[str, Any]]:
    """The two judgements of a check, as the worker asks for them."""

    def judge(clip: np.ndarray) -> dict[str, Any]:
        session.hear(clip, paused=True)  # the same words as before: the judgement stands
        early = session._early  # the benchmark reads what the engine keeps of its early work
        early.judged.wait(JUDGED_WAIT_S)
        return {
            "transcript": early.transcript.text if early.transcript is not None else None,
            "asr_logprob": None
            if early.transcript is None or early.transcript.logprob is None
            else round(early.transcript.logprob, 3),
            "words_p": None if early.end_p is None else round(early.end_p, 4),
            # (bare, as heard): LlamaChat.end_probability's two readings
            "words_readings": None
            if early.end_readings is None
            else [None if r is None else round(r, 4) for r in early.end_readings],
            "audio_p": round(turn_judge.probability(clip), 4),
        }

    return judge


# --- rules -------------------------------------------------------------------------------

Rule = Callable[[dict[str, Any]], tuple[bool, bool]]  # a check -> (finished, settled)


def words_lead(words_threshold: float = 0.2, sound_threshold: float = 0.9) -> Rule:
    """``end_of_turn.verdict`` with ``audio_veto`` 0: the words decide where
    they are judged, the sound where not."""

    def rule(check: dict[str, Any]) -> tuple[bool, bool]:
        if check["words_p"] is None:
            return check["audio_p"] >= sound_threshold, False
        return check["words_p"] >= words_threshold, True

    return rule


def decided(checks: list[dict[str, Any]], speech_end_ms: float, rule: Rule,
            confirmations: int = 2) -> tuple[float, bool]:  # fmt: skip
    """When ``rule`` ends the turn: (the silence after the speech's end,
    ms, negative for a cut-in; whether it ended inside the speech)."""
    pauses: dict[int, list[dict[str, Any]]] = {}
    for check in checks:
        pauses.setdefault(check["pause_ms"], []).append(check)
    for pause_ms, mine in sorted(pauses.items()):
        verdicts: dict[int, bool] = {}
        words_judged_unfinished = False
        for check in mine:
            finished, settled = rule(check)
            words_judged_unfinished |= check["words_p"] is not None and not finished
            verdicts[check["round"]] = finished
            needed = 1 if settled else confirmations
            rounds = range(check["round"] - needed + 1, check["round"] + 1)
            if all(verdicts.get(r) for r in rounds):
                return _ended(pause_ms, check["silence_ms"], speech_end_ms, check["at_end"])
        # no check decided in this pause: the silence the rule waits for, if it lasted
        wait = PATIENCE_MS if words_judged_unfinished else RULE_MS
        last = mine[-1]
        if not last["at_end"]:
            if last["silence_ms"] + 200 >= wait:  # the pause outlasted the wait: cut there
                return _ended(pause_ms, wait, speech_end_ms, False)
            continue
        return _ended(pause_ms, wait, speech_end_ms, True)
    return float("nan"), False


def _ended(pause_ms: float, silence_ms: float, speech_end_ms: float, at_end: bool
           ) -> tuple[float, bool]:  # fmt: skip
    return pause_ms + silence_ms - speech_end_ms, not at_end


def replay(turns: list[dict[str, Any]], rule: Rule) -> dict[str, Any]:
    questions = [t for t in turns if t["kind"] == "question"]
    paused = [t for t in turns if t["kind"] == "paused"]
    delays, cut_questions = [], 0
    for turn in questions:
        delay, cut = decided(turn["checks"], turn["speech_end_ms"], rule)
        cut_questions += cut
        if not cut:
            delays.append(delay)
    cut_paused = sum(decided(t["checks"], t["speech_end_ms"], rule)[1] for t in paused)
    return {
        "delay_ms": {
            "median": round(statistics.median(delays), 1) if delays else None,
            "p90": round(percentile(delays, 90), 1),
            "over_1000": sum(d > 1000 for d in delays),
            "n": len(delays),
        },
        "questions_cut_in_on": cut_questions,
        "paused_turns_cut": cut_paused,
        "paused_turns": len(paused),
    }


def unsure_words_unheard(logprob_floor: float, words_threshold: float = 0.2) -> Rule:
    """As :func:`words_lead`, but words Whisper was unsure of (mean token
    log-probability under ``logprob_floor``) that would hold the turn are no
    opinion: the sound judges, as for an engine that judges no words."""
    lead = words_lead(words_threshold)

    def rule(check: dict[str, Any]) -> tuple[bool, bool]:
        unsure = check.get("asr_logprob") is not None and check["asr_logprob"] < logprob_floor
        if unsure and check["words_p"] is not None and check["words_p"] < words_threshold:
            return lead({**check, "words_p": None})
        return lead(check)

    return rule


def doubtful_words_to_the_sound(floor: float, words_threshold: float = 0.2) -> Rule:
    """Words judged between ``floor`` and the threshold are doubtful: the
    sound decides (``confirmations`` checks in a row), as with no words."""
    lead = words_lead(words_threshold)

    def rule(check: dict[str, Any]) -> tuple[bool, bool]:
        words = check["words_p"]
        if words is not None and floor <= words < words_threshold:
            return lead({**check, "words_p": None})
        return lead(check)

    return rule


def bare_words_lead(words_threshold: float = 0.2) -> Rule:
    """:func:`words_lead` on the bare words' reading alone (the rule before
    the words as heard were read, issue 57)."""
    lead = words_lead(words_threshold)

    def rule(check: dict[str, Any]) -> tuple[bool, bool]:
        readings = check.get("words_readings")
        return lead({**check, "words_p": readings[0]} if readings else check)

    return rule


RULES: dict[str, Rule] = {
    "words_lead_0.2": words_lead(),
    "bare_words_lead_0.2": bare_words_lead(),
    **{f"doubtful_from_{f}_to_the_sound": doubtful_words_to_the_sound(f) for f in (0.001, 0.01)},
    **{f"unsure_below_{f}": unsure_words_unheard(f) for f in (-0.5, -0.6, -0.7, -0.8, -1.0)},
}


# --- running -----------------------------------------------------------------------------


def record(args: argparse.Namespace) -> list[dict[str, Any]]:
    from omnilive.end_of_turn import SmartTurn
    from omnilive.engine_settings import CascadeSettings
    from omnilive.engines.cascade import CascadeEngine
    from omnilive.engines.messages import HalfDuplexOptions, TextPart

    turn_judge = SmartTurn.load(None)
    config = server_vad_config()
    turns: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as data:
        engine = CascadeEngine(CascadeSettings(), Path(data))
        engine.load(lambda *_: None)
        session = engine.open_half_duplex()
        system = [TextPart("You are a helpful assistant. Answer in one short sentence.")]
        session.prepare(system, HalfDuplexOptions(tts_enabled=False))
        judge = engine_judge(session, turn_judge)
        span = max(1, args.paused - 1)
        for voice in args.voices:
            spoken = [("question", q, speak(q, voice)) for q in QUESTIONS[: args.questions]]
            spoken += [
                ("paused", t, with_pause(speak(t, voice), 0.6 + 0.4 * i / span))
                for i, t in enumerate(PAUSED[: args.paused])
            ]
            for kind, text, speech in spoken:
                checks, speech_end_ms = checks_of(speech, config, judge)
                turn = {"voice": voice, "kind": kind, "text": text,
                        "speech_end_ms": round(speech_end_ms), "checks": checks}  # fmt: skip
                turns.append(turn)
                last = [c for c in checks if c["at_end"]][:1]
                print(voice, kind, text, json.dumps(last[0] if last else None))
        session.close()
        engine.close()
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voices", type=lambda s: s.split(","), default=VOICES)
    parser.add_argument("--questions", type=int, default=len(QUESTIONS))
    parser.add_argument("--paused", type=int, default=len(PAUSED))
    parser.add_argument("--replay", type=Path, help="replay the rules on a recorded run")
    parser.add_argument("--out", type=Path, help="result file (default: benchmarks/results/...)")
    args = parser.parse_args()
    if args.replay is not None:
        result = json.loads(args.replay.read_text())
        turns = result["turns"]
    else:
        turns = record(args)
        result = {
            "benchmark": "turn_verdicts",
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": this_machine(),
            "config": {"voices": args.voices, "questions": args.questions, "paused": args.paused},
            "turns": turns,
        }
    result["rules"] = {name: replay(turns, rule) for name, rule in RULES.items()}
    for name, figures in result["rules"].items():
        print(name, json.dumps(figures))
    out = args.out or args.replay or RESULTS / "turn_verdicts.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
