"""WebRTC against the WebSocket for the same session and the same audio
(issue 38): bytes per second up and down, end of speech to the answer's
first audio through each transport in the same run, the gateway's CPU per
session, and how many WebRTC calls at once keep the added delay small.

Starts ``omnilive serve`` (scripted engine by default), speaks the same
question (espeak-ng) to OpenAI's Realtime dialect over ``/v1/realtime``
(a WebSocket client sending 24 kHz pcm16 in pieces of ``--ws-chunk-s``, 20 ms
by default as an Opus packet, each once its audio has been "captured", as a
microphone can) and over ``POST /v1/realtime/calls`` (an aiortc peer, Opus,
its 20 ms packets paced the same way), turns
alternating, the microphone open for a fixed window in both (silence after
the question, as a live page sends). Bytes are what each transport carries
above UDP/TCP: WebSocket frame payloads, DTLS records of the peer connection.
The client runs on the same machine as the gateway, so the concurrency
figures are a floor. Prints a summary and saves everything under
benchmarks/results/webrtc_transport.json.

    python -m benchmarks.webrtc_transport [--turns 3] [--concurrency 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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
from tests.webrtc_peer import Peer
from websockets.asyncio.client import connect

from benchmarks.load import percentile, save_result

QUESTION = "What is the weather like in Paris today?"
WINDOW_S = 9.0  # the microphone is open this long in every turn
SESSION = {
    "type": "realtime",
    "audio": {
        "input": {
            "transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
        }
    },
}
TICK = os.sysconf("SC_CLK_TCK")
# First audio is the first audible sample (as tests/webrtc_peer.py hears it),
# through both transports: an answer may open with near-silence.
AUDIBLE = 0.02


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def pcm24(audio: np.ndarray) -> bytes:
    from omnilive.audio import INPUT_RATE, resample

    return (np.clip(resample(audio, INPUT_RATE, 24_000), -1, 1) * 32767).astype("<i2").tobytes()


async def websocket_turn(server: Server, speech: np.ndarray, chunk_s: float) -> dict[str, Any]:
    sent = received = 0
    first_audio: float | None = None
    stopped: float | None = None
    url = f"{server.ws}/v1/realtime?model=omnilive-realtime"
    async with connect(url, max_size=None, compression=None) as ws:

        async def recv_until(kind: str) -> dict[str, Any]:
            nonlocal received, first_audio, stopped
            while True:
                raw = await ws.recv()
                received += len(raw)
                event = json.loads(raw)
                if event["type"] == "input_audio_buffer.speech_stopped" and stopped is None:
                    stopped = time.monotonic()
                if event["type"] == "response.output_audio.delta" and first_audio is None:
                    pcm = np.frombuffer(base64.b64decode(event["delta"]), "<i2")
                    if pcm.size and np.abs(pcm).max() > AUDIBLE * 32768:
                        first_audio = time.monotonic()
                if event["type"] == kind:
                    return event

        await recv_until("session.created")
        await ws.send(json.dumps({"type": "session.update", "session": SESSION}))
        await recv_until("session.updated")
        audio = np.concatenate([speech, silence(WINDOW_S - speech.size / 16_000)])
        pcm = pcm24(audio)
        step = round(24_000 * chunk_s) * 2
        cpu0, t0 = cpu_s(server.process.pid), time.monotonic()
        speech_end = t0 + speech.size / 16_000
        reader = asyncio.create_task(recv_until("response.done"), name="websocket-reader")
        for k, start in enumerate(range(0, len(pcm), step)):
            # A piece can go once its last sample is captured, not before.
            delay = t0 + (k + 1) * chunk_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            text = json.dumps(
                {"type": "input_audio_buffer.append",
                 "audio": base64.b64encode(pcm[start : start + step]).decode()}
            )  # fmt: skip
            sent += len(text)
            await ws.send(text)
        await reader
        wall = time.monotonic() - t0
        cpu = cpu_s(server.process.pid) - cpu0
    return {
        "transport": "websocket",
        "up_bytes_per_s": round(sent / wall),
        "down_bytes_per_s": round(received / wall),
        "first_audio_ms": round((first_audio - speech_end) * 1000, 1) if first_audio else None,
        "speech_stopped_ms": round((stopped - speech_end) * 1000, 1) if stopped else None,
        "gateway_cpu_cores": round(cpu / wall, 4),
        "window_s": round(wall, 2),
    }


async def transport_bytes(peer: Peer) -> tuple[int, int]:
    report = await peer.pc.getStats()
    stats = [s for s in report.values() if s.type == "transport"]
    return sum(s.bytesSent for s in stats), sum(s.bytesReceived for s in stats)


async def webrtc_turn(server: Server, speech: np.ndarray) -> dict[str, Any]:
    # The client buffers as the gateway does (a browser's buffer adapts, from ~20 ms).
    peer = Peer(jitter_packets=1)
    try:
        response = await peer.call(f"{server.http}/v1/realtime/calls?model=omnilive-realtime")
        response.raise_for_status()
        await peer.until("session.created")
        peer.send({"type": "session.update", "session": SESSION})
        await peer.until("session.updated")
        up0, down0 = await transport_bytes(peer)
        cpu0, t0 = cpu_s(server.process.pid), time.monotonic()
        peer.mic.play(speech)
        await peer.until("input_audio_buffer.speech_stopped", timeout=60)
        stopped = time.monotonic()
        await peer.until("response.done", timeout=60)
        await asyncio.sleep(max(0.0, t0 + WINDOW_S - time.monotonic()))
        wall = time.monotonic() - t0
        cpu = cpu_s(server.process.pid) - cpu0
        up1, down1 = await transport_bytes(peer)
        first = peer.first_sound_at
        # The clip starts at the microphone's next packet, up to 20 ms after play().
        assert peer.mic.clip_started_at is not None
        speech_end = peer.mic.clip_started_at + speech.size / 16_000
    finally:
        await peer.close()
    return {
        "transport": "webrtc",
        "up_bytes_per_s": round((up1 - up0) / wall),
        "down_bytes_per_s": round((down1 - down0) / wall),
        "first_audio_ms": round((first - speech_end) * 1000, 1) if first else None,
        "speech_stopped_ms": round((stopped - speech_end) * 1000, 1),
        "gateway_cpu_cores": round(cpu / wall, 4),
        "window_s": round(wall, 2),
    }


async def concurrent_calls(server: Server, speech: np.ndarray, n: int) -> dict[str, Any]:
    """``n`` WebRTC turns at once: their first-audio delays and the gateway's CPU."""
    cpu0, t0 = cpu_s(server.process.pid), time.monotonic()
    turns = await asyncio.gather(*(webrtc_turn(server, speech) for _ in range(n)))
    cpu = cpu_s(server.process.pid) - cpu0
    delays = [t["first_audio_ms"] for t in turns if t["first_audio_ms"] is not None]
    return {
        "calls": n,
        "first_audio_ms": delays,
        "p99_first_audio_ms": round(percentile(delays, 99), 1),
        "gateway_cpu_cores": round(cpu / (time.monotonic() - t0), 3),
    }


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else float("nan")


def summarize(turns: list[dict[str, Any]], levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per transport; the delay WebRTC adds to the first audio against
    the WebSocket, and what concurrent calls add against one call."""
    by = {t: [x for x in turns if x["transport"] == t] for t in ("websocket", "webrtc")}
    keys = ("up_bytes_per_s", "down_bytes_per_s", "first_audio_ms", "speech_stopped_ms",
            "gateway_cpu_cores")  # fmt: skip
    summary: dict[str, Any] = {
        t: {key: median([x[key] for x in rows if x.get(key) is not None]) for key in keys}
        for t, rows in by.items()
    }
    base = summary["websocket"]["first_audio_ms"]
    summary["webrtc_added_first_audio_ms"] = round(summary["webrtc"]["first_audio_ms"] - base, 1)
    summary["webrtc_added_speech_stopped_ms"] = round(
        summary["webrtc"]["speech_stopped_ms"] - summary["websocket"]["speech_stopped_ms"], 1
    )
    one = median(levels[0]["first_audio_ms"]) if levels else float("nan")
    for level in levels:
        level["p99_added_ms"] = round(level["p99_first_audio_ms"] - base, 1)
        level["p99_added_vs_one_call_ms"] = round(level["p99_first_audio_ms"] - one, 1)
    fits = [lv["calls"] for lv in levels if lv["p99_added_ms"] <= 20]
    summary["most_calls_within_20ms_p99"] = max(fits) if fits else 0
    relayed = [lv["calls"] for lv in levels if lv["p99_added_vs_one_call_ms"] <= 20]
    summary["most_calls_within_20ms_p99_of_one_call"] = max(relayed) if relayed else 0
    return summary


async def run(args: argparse.Namespace) -> dict[str, Any]:
    speech = np.concatenate([silence(0.5), speak(QUESTION)])
    with tempfile.TemporaryDirectory() as tmp:
        slots = max(args.concurrency)
        env = {"OMNILIVE_SCRIPTED__SLOTS": str(slots)}
        server = Server(Path(tmp), engine=args.engine, env=env).start()
        try:
            await server.wait_ready(timeout=300, workers=1)
            turns: list[dict[str, Any]] = []
            for k in range(args.turns):
                ws_turn = websocket_turn(server, speech, args.ws_chunk_s)
                rtc_turn = webrtc_turn(server, speech)
                for turn in (ws_turn, rtc_turn) if k % 2 == 0 else (rtc_turn, ws_turn):
                    turns.append(await turn)
                    print(turns[-1])
            levels = []
            for n in args.concurrency:
                levels.append(await concurrent_calls(server, speech, n))
                print({k: v for k, v in levels[-1].items() if k != "first_audio_ms"})
        finally:
            server.stop()
    summary = summarize(turns, levels)
    return {
        "benchmark": "webrtc_transport",
        "engine": args.engine,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "question": QUESTION,
        "window_s": WINDOW_S,
        "ws_chunk_s": args.ws_chunk_s,
        "summary": summary,
        "turns": turns,
        "concurrency": levels,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="scripted")
    parser.add_argument("--turns", type=int, default=3, help="turns per transport")
    parser.add_argument("--concurrency", default="1,2,4", help="WebRTC calls at once")
    parser.add_argument(
        "--ws-chunk-s", type=float, default=0.02, help="the WebSocket client's piece of audio"
    )
    args = parser.parse_args()
    args.concurrency = [int(n) for n in args.concurrency.split(",") if n]
    result = asyncio.run(run(args))
    print(json.dumps(result["summary"], indent=2))
    save_result("webrtc_transport", result)


if __name__ == "__main__":
    main()
