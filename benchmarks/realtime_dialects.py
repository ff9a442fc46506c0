"""End of speech to first answer audio: OpenAI's Realtime dialect (GA) against
the MiniCPM-o dialect (``/ws/half_duplex``) on the same engine, in one run.

Starts ``omnilive serve`` (cascade by default), opens one session of each
dialect with the same turn detection (threshold 0.5, 500 ms of silence, 30 ms
padding) and a prompt no earlier session began with (no cached prefix), and
plays the same spoken questions (espeak-ng) to both, alternating which goes
first, at microphone pace (100 ms pieces sent in real time). Both servers'
VADs hear the very same samples: the OpenAI dialect's audio is 24 kHz pcm16,
which the server turns back into 16 kHz piece by piece, and the half-duplex
session is sent that result, not the original (else the two VADs, hearing
slightly different audio, find pauses at different moments, and the cascade's
early answer starts at a different time). For each it records,
from the moment the speech ended, when the server said the speech stopped
and when the answer's first audio arrived. Prints medians and saves every
figure under benchmarks/results/.

    python -m benchmarks.realtime_dialects [--engine cascade] [--questions 6]
        [--no-early-answer] [--rounds 2]

The cascade's early answer (started at a pause, before the VAD ends the
turn) makes one turn's timing vary by hundreds of ms with the moment its
transcripts happen to run; ``--no-early-answer`` leaves all the work to
the end of the turn, whose time then repeats to a few ms, so a pair's
difference is the dialect's own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tests.servers import Server
from tests.speech import speak
from websockets.asyncio.client import connect

from benchmarks.bench_server import server_env
from benchmarks.cascade_latency import QUESTIONS, RESULTS, summary
from benchmarks.load import this_machine
from benchmarks.microphone import RATE, Microphone, spoken_turn
from omnilive.audio_codecs import decode_input

SILENCE_MS, THRESHOLD, PAD_MS, CHUNK_S = 500, 0.5, 30, 0.1
# Answers are timed to their first audio; a short one keeps a run short on a
# random-weights checkpoint, whose answers seldom end by themselves.
MAX_TOKENS = 40
COLD_START_S = 0.6  # silence played first on both sessions (the VAD's cold-start guard)
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."


def instructions(serial: int) -> str:
    """A prompt no earlier session began with: llama.cpp reuses the longest
    cached prefix, so a session asked what the last one was asked, with the
    same prompt, would skip its prompt evaluation and look faster."""
    return f"Session {serial}. {INSTRUCTIONS}"


async def half_duplex_session(server: Server, serial: int) -> Any:
    ws = await connect(f"{server.ws}/ws/half_duplex/bench_{os.getpid()}", max_size=None)
    while json.loads(await ws.recv())["type"] != "queue_done":
        pass
    vad = {"threshold": THRESHOLD, "min_silence_duration_ms": SILENCE_MS, "speech_pad_ms": PAD_MS}
    await ws.send(
        json.dumps(
            {
                "type": "prepare",
                "system_prompt": instructions(serial),
                "config": {
                    "vad": vad,
                    "generation": {"max_new_tokens": MAX_TOKENS, "do_sample": False},
                },
            }
        )
    )
    while json.loads(await ws.recv())["type"] != "prepared":
        pass
    await Microphone(ws, CHUNK_S).play(np.zeros(round(COLD_START_S * RATE), np.float32))
    return ws


async def openai_session(server: Server, serial: int) -> Any:
    ws = await connect(f"{server.ws}/v1/realtime?model=bench", max_size=None)
    detection = {
        "type": "server_vad",
        "threshold": THRESHOLD,
        "silence_duration_ms": SILENCE_MS,
        "prefix_padding_ms": PAD_MS,
    }
    session = {
        "type": "realtime",
        "instructions": instructions(serial),
        "audio": {"input": {"turn_detection": detection}},
        "max_output_tokens": MAX_TOKENS,  # as the half-duplex session's answers
        "temperature": 0,  # greedy, as theirs: the same question gets the same answer
    }
    await ws.send(json.dumps({"type": "session.update", "session": session}))
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass
    silence = pcm24(np.zeros(round(CHUNK_S * RATE), np.float32))
    for _ in range(round(COLD_START_S / CHUNK_S)):  # the half-duplex session's cold-start guard
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
        await asyncio.sleep(CHUNK_S)
    return ws


def pcm24(audio: np.ndarray) -> str:
    samples = np.interp(np.arange(round(audio.size * 1.5)) / 1.5, np.arange(audio.size), audio)
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def whole_pieces(speech: np.ndarray) -> np.ndarray:
    """Speech padded with silence to whole 100 ms pieces, so both dialects'
    pieces hold the same samples."""
    chunk = round(CHUNK_S * RATE)
    return np.pad(speech, (0, -speech.size % chunk))


def as_received(speech: np.ndarray) -> np.ndarray:
    """What a GA session's server hears of ``speech`` (16 kHz, whole
    pieces): each piece sent as 24 kHz pcm16 and decoded back."""
    chunk = round(CHUNK_S * RATE)
    pieces = [speech[i : i + chunk] for i in range(0, speech.size, chunk)]
    return np.concatenate([decode_input(pcm24(p), "audio/pcm") for p in pieces])


async def openai_turn(ws: Any, speech: np.ndarray, lead_s: float = 0.8) -> dict[str, Any]:
    """Speak at microphone pace on a GA session; times from the end of speech."""
    audio = np.concatenate(
        [
            np.zeros(round(lead_s * RATE), np.float32),
            speech,
            np.zeros(round(3.0 * RATE), np.float32),
        ]
    )
    events: dict[str, float] = {}
    said: list[str] = []  # the answer's text before its first audio
    answering = asyncio.Event()

    async def listen() -> None:
        async for raw in ws:
            message, now = json.loads(raw), time.perf_counter()
            kind = message["type"]
            if kind == "input_audio_buffer.speech_stopped":
                events.setdefault("vad_end", now)
                answering.set()  # as the half-duplex client does, stop sending (echo)
            elif kind == "response.output_audio_transcript.delta" and "first_audio" not in events:
                said.append(message["delta"])
            elif kind == "response.output_audio.delta" and "first_audio" not in events:
                events["first_audio"] = now  # timed: the rest of the answer is not needed
                await ws.send(json.dumps({"type": "response.cancel"}))
            elif kind == "response.done":
                return
            elif kind == "error":
                raise RuntimeError(f"server error: {message}")

    listener = asyncio.create_task(listen(), name="dialect-listener")
    chunk = round(CHUNK_S * RATE)
    t0 = time.perf_counter()
    for k, start in enumerate(range(0, audio.size, chunk)):
        if answering.is_set():
            break
        delay = t0 + (k + 1) * CHUNK_S - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        piece = {"type": "input_audio_buffer.append", "audio": pcm24(audio[start : start + chunk])}
        await ws.send(json.dumps(piece))
    await asyncio.wait_for(listener, 180)
    end = t0 + lead_s + speech.size / RATE
    return {
        "vad_ms": round((events["vad_end"] - end) * 1000, 1),
        "e2e_ms": round((events["first_audio"] - end) * 1000, 1),
        "first_text": "".join(said),
    }


async def run(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Ask the questions through both dialects; each pair of turns goes into
    ``rows`` as it is measured (a run cut short keeps what it measured)."""
    questions = [q for q in QUESTIONS if 2.0 <= speak(q).size / RATE <= 5.0][: args.questions]
    with tempfile.TemporaryDirectory() as tmp:
        # Both dialects end turns by the same silence rule: the end-of-turn
        # model (half-duplex's default; the GA dialect's semantic_vad) is off.
        env = {"OMNILIVE_END_OF_TURN__ENABLED": "false"}
        if not args.early_answer:  # the cascade's early answer races the VAD: timings vary
            env["OMNILIVE_CASCADE__EARLY_ANSWER"] = "false"
        if args.model_path is not None:  # MiniCPM-o on a GPU: its checkpoint, one slot a dialect
            env |= server_env(args.model_path.resolve(), 8, OMNILIVE_MINICPMO__SLOTS="2")
            env["OMNILIVE_MINICPMO__MODEL_PATH"] = str(args.model_path.resolve())
        server = Server(Path(tmp), engine=args.engine, env=env).start()
        try:
            await server.wait_ready(timeout=300, workers=1)
            # One session at a time (the engine has one slot), in alternating order.
            for index, question in enumerate(questions * args.rounds):
                speech = whole_pieces(speak(question))
                heard = as_received(speech)
                measured: dict[str, Any] = {}
                for dialect in ("minicpmo", "openai")[:: 1 if index % 2 == 0 else -1]:
                    if dialect == "minicpmo":
                        hd = await half_duplex_session(server, 2 * index)
                        measured[dialect] = await spoken_turn(hd, Microphone(hd, CHUNK_S), heard)
                        await hd.close()
                    else:
                        ga = await openai_session(server, 2 * index + 1)
                        measured[dialect] = await openai_turn(ga, speech)
                        await ga.close()
                turn, openai = measured["minicpmo"], measured["openai"]
                row = {
                    "question": question,
                    "speech_s": round(speech.size / RATE, 2),
                    "minicpmo_vad_ms": turn.vad_ms,
                    "minicpmo_e2e_ms": turn.first_audio_ms,
                    "openai_vad_ms": openai["vad_ms"],
                    "openai_e2e_ms": openai["e2e_ms"],
                    # Greedy answers: the two should begin alike, or the pair
                    # also compares two different answers.
                    "minicpmo_first_text": turn.first_text,
                    "openai_first_text": openai["first_text"],
                }
                rows.append(row)
                print(
                    f"minicpmo e2e {row['minicpmo_e2e_ms']:6.0f} ms   openai e2e "
                    f"{row['openai_e2e_ms']:6.0f} ms   {question}",
                    flush=True,
                )
                await asyncio.sleep(0.5)
        finally:
            server.stop()


def summarised(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    def column(name: str) -> list[float]:
        return [r[name] for r in rows]

    # Each pair is one question through both dialects: its difference is
    # the dialect's cost plus the two answers' own variation.
    pairs = sorted(r["openai_e2e_ms"] - r["minicpmo_e2e_ms"] for r in rows)
    margin = 1.96 * statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else 0.0

    after_vad = {
        d: [r[f"{d}_e2e_ms"] - r[f"{d}_vad_ms"] for r in rows] for d in ("minicpmo", "openai")
    }
    return {
        "benchmark": "realtime_dialects",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "engine": args.engine,
        "machine": this_machine(),
        "config": {
            "early_answer": args.early_answer,
            "chunk_s": CHUNK_S,
            "silence_ms": SILENCE_MS,
            "threshold": THRESHOLD,
            "pad_ms": PAD_MS,
        },
        "summary_ms": {
            "minicpmo_end_to_end": summary(column("minicpmo_e2e_ms")),
            "openai_end_to_end": summary(column("openai_e2e_ms")),
            "minicpmo_after_vad": summary(after_vad["minicpmo"]),
            "openai_after_vad": summary(after_vad["openai"]),
            "openai_minus_minicpmo_median": round(
                statistics.median(column("openai_e2e_ms"))
                - statistics.median(column("minicpmo_e2e_ms")),
                1,
            ),
            "openai_minus_minicpmo_paired": {
                "median": round(statistics.median(pairs), 1),
                "mean": round(statistics.fmean(pairs), 1),
                # the mean's 95% interval (normal approximation): what the
                # pairs say the dialect costs, its noise included
                "mean_95ci": [round(statistics.fmean(pairs) + s * margin, 1) for s in (-1, 1)],
                "min": round(pairs[0], 1),
                "max": round(pairs[-1], 1),
                "openai_later": sum(d > 0 for d in pairs),
                "n": len(pairs),
                "same_first_text": sum(
                    r["minicpmo_first_text"].strip() == r["openai_first_text"].strip() for r in rows
                ),
            },
        },
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="cascade")
    parser.add_argument("--model-path", type=Path, help="minicpmo: the checkpoint to serve")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2, help="times each question is asked")
    parser.add_argument(
        "--no-early-answer",
        dest="early_answer",
        action="store_false",
        help="cascade: all work after the end of the turn (repeatable timings)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    try:
        asyncio.run(run(args, rows))
    finally:  # a run stopped early (a time limit) saves the pairs it measured
        if rows:
            result = summarised(args, rows)
            print(json.dumps(result["summary_ms"], indent=2))
            suffix = "" if args.early_answer else "_no_early_answer"
            out = args.out or RESULTS / f"realtime_dialects_{args.engine}{suffix}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"saved {out}", flush=True)


if __name__ == "__main__":
    main()
