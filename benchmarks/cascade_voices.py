"""The embedded cascade's voices and its cost: Piper against espeak-ng, and
the engine's memory and start-up with and without the wave-3 models.

Voices: the same sentences (answers an assistant gives, 4-20 words) spoken by
the Piper voice and by espeak-ng, one at a time as the cascade speaks them.
For each: the synthesis time of the sentence (its first audio: the cascade
speaks a sentence as a whole), the real-time factor (synthesis time / audio
length) and Whisper's transcript of it (the cascade's own Whisper, base, at
16 kHz), scored as word error rate against the text (lower case, words only).
Seams: each sentence also spoken in the pieces an answer's first sentence is
spoken in (its first words read as a clause, then the rest), and Whisper's
word error rate of the joined pieces against the sentence spoken whole.

Cost: a fresh process per configuration loads the engine as the worker does
(``CascadeEngine.load``, plus the end-of-turn model when it is on) and
reports its load time and resident memory (VmRSS and VmHWM from /proc):
``before`` is espeak-ng with the silence rule only (wave 2), ``after`` the
Piper voice and the Smart Turn model (wave 3's default).

    python -m benchmarks.cascade_voices [--sentences 12] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.load import save_result, this_machine

SENTENCES = [
    "The blue whale is the largest animal on our planet.",
    "You could call her Midnight, or maybe Shadow.",
    "Airplanes stay up because their wings push air downwards.",
    "The tallest mountain in the world is Mount Everest.",
    "Oatmeal with fruit is a healthy breakfast.",
    "Cats sleep a lot because they save energy for hunting.",
    "Pack light clothes, a rain jacket and comfortable shoes.",
    "A black hole is a place where gravity pulls so hard that even light cannot escape.",
    "London is often mild and rainy in the spring.",
    "Practice a little every day and talk with native speakers.",
    "Sure, I have set an alarm for seven in the morning.",
    "The ocean covers more than seventy percent of the Earth.",
    "A good book for the weekend is The Hobbit by Tolkien.",
    "The moon is slowly moving away from the Earth every year.",
]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, heard: str) -> float:
    """Levenshtein distance over words, divided by the reference's length."""
    ref, hyp = words(reference), words(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / max(1, len(ref))


def voices(count: int) -> dict[str, Any]:
    from omnilive.audio import INPUT_RATE, OUTPUT_RATE, resample
    from omnilive.engine_settings import CascadeSettings
    from omnilive.engines.cascade import CascadeEngine
    from omnilive.engines.cascade.tts import PIPER

    with tempfile.TemporaryDirectory() as data:
        engine = CascadeEngine(CascadeSettings(), Path(data))
        engine.load(lambda *_: None)
        tts, asr = engine.stack.tts, engine.stack.asr
        rows = []
        for voice in (PIPER, tts.espeak.default):
            for sentence in SENTENCES[:count]:
                started = time.perf_counter()
                audio = tts.synthesize(sentence, voice)
                cost_ms = (time.perf_counter() - started) * 1000
                seconds = audio.size / OUTPUT_RATE
                heard = asr.transcribe(resample(audio, OUTPUT_RATE, INPUT_RATE)).text
                rows.append(
                    {
                        "voice": "piper" if voice == PIPER else "espeak",
                        "sentence": sentence,
                        "first_audio_ms": round(cost_ms, 1),
                        "audio_s": round(seconds, 2),
                        "rtf": round(cost_ms / 1000 / seconds, 3),
                        "heard": heard,
                        "wer": round(word_error_rate(sentence, heard), 3),
                    }
                )
        seam_rows = [seam(sentence, tts, asr) for sentence in SENTENCES[:count]]
        engine.close()
    summary = {}
    for name in ("piper", "espeak"):
        mine = [r for r in rows if r["voice"] == name]
        reference_words = sum(len(words(r["sentence"])) for r in mine)
        errors = sum(r["wer"] * len(words(r["sentence"])) for r in mine)
        summary[name] = {
            "first_audio_ms_median": round(statistics.median(r["first_audio_ms"] for r in mine), 1),
            "first_audio_ms_max": max(r["first_audio_ms"] for r in mine),
            "rtf_median": round(statistics.median(r["rtf"] for r in mine), 3),
            "wer": round(errors / reference_words, 3),  # over all words, not a mean of rates
        }
    for way in ("whole", "pieces"):
        reference_words = sum(len(words(r["sentence"])) for r in seam_rows)
        errors = sum(r[f"wer_{way}"] * len(words(r["sentence"])) for r in seam_rows)
        summary[f"piper_{way}"] = {"wer": round(errors / reference_words, 3)}
    return {"summary": summary, "rows": rows, "seams": seam_rows}


def seam(sentence: str, tts: Any, asr: Any) -> dict[str, Any]:
    """``sentence`` spoken by Piper whole, and in the pieces an answer's first
    sentence is spoken in (``SentenceSplitter``: the first FIRST_MAX_WORDS
    words read as a clause, then the rest), each as Whisper hears it."""
    import numpy as np

    from omnilive.audio import INPUT_RATE, OUTPUT_RATE, resample
    from omnilive.engines.cascade.answer import SentenceSplitter, shortened_pause, spoken_as
    from omnilive.engines.cascade.tts import PIPER

    splitter = SentenceSplitter()
    first, *more = sentence.split(" ")
    cut = [p for piece in (first, *(" " + w for w in more)) for p in splitter.feed(piece)]
    pieces = [*cut, splitter.flush()]
    audio = []
    for i, piece in enumerate(pieces):
        spoken = spoken_as(piece, more=i + 1 < len(pieces))
        sound = tts.synthesize(spoken, PIPER)
        audio.append(shortened_pause(sound) if spoken != piece else sound)
    row: dict[str, Any] = {"sentence": sentence, "pieces": pieces}
    for way, sound in (
        ("whole", tts.synthesize(sentence, PIPER)),
        ("pieces", np.concatenate(audio)),
    ):
        heard = asr.transcribe(resample(sound, OUTPUT_RATE, INPUT_RATE)).text
        row[f"heard_{way}"] = heard
        row[f"wer_{way}"] = round(word_error_rate(sentence, heard), 3)
    return row


# What one configuration's process runs: the worker's loading, then /proc.
_LOAD = """
import json, sys, tempfile, time
from pathlib import Path
from omnilive.engine_settings import CascadeSettings
from omnilive.end_of_turn import SmartTurn
from omnilive.engines.cascade import CascadeEngine
tts, turn = sys.argv[1], sys.argv[2] == "on"
started = time.perf_counter()
with tempfile.TemporaryDirectory() as data:
    engine = CascadeEngine(CascadeSettings(tts=tts), Path(data))
    engine.load(lambda *_: None)
    judge = SmartTurn.load(None) if turn else None
    load_s = time.perf_counter() - started
    status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
    kb = lambda key: int(status[key].split()[0])
    print(json.dumps({"load_s": round(load_s, 3), "engine": engine.load_timings,
                      "rss_mib": round(kb("VmRSS") / 1024, 1),
                      "peak_rss_mib": round(kb("VmHWM") / 1024, 1)}))
"""
CONFIGS = {"before": ("espeak", "off"), "after": ("piper", "on")}


def cost(runs: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, (tts, turn) in CONFIGS.items():
        samples = []
        for _ in range(runs):
            out = subprocess.run(
                [sys.executable, "-c", _LOAD, tts, turn],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            samples.append(json.loads(out.strip().splitlines()[-1]))
        result[name] = {
            "tts": tts,
            "end_of_turn": turn,
            "load_s_median": round(statistics.median(s["load_s"] for s in samples), 3),
            "rss_mib_median": round(statistics.median(s["rss_mib"] for s in samples), 1),
            "peak_rss_mib_median": round(statistics.median(s["peak_rss_mib"] for s in samples), 1),
            "runs": samples,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per configuration")
    args = parser.parse_args()
    spoken = voices(args.sentences)
    for name, figures in spoken["summary"].items():
        print(f"{name:7s} {json.dumps(figures)}")
    loading = cost(args.runs)
    for name, figures in loading.items():
        shown = {k: v for k, v in figures.items() if k != "runs"}
        print(f"{name:7s} {json.dumps(shown)}")
    result = {
        "benchmark": "cascade_voices",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": this_machine(),
        "voices": spoken,
        "cost": loading,
    }
    save_result("cascade_voices", result)


if __name__ == "__main__":
    main()
