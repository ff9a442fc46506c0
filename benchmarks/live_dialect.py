"""OpenAI's Live API on the cascade (CPU): what the dialect adds, and how its
delegations are judged.

1. **Latency**: the end of the user's speech to the first audio of the
   answer, through ``/v1/live/sessions`` against the same engine's duplex
   route (``/ws/duplex``), in one run: the same spoken questions (espeak-ng)
   sent to both in 1 s pieces at microphone pace, alternating which goes
   first, both with the same instructions (the duplex route's default
   prompt). The Live session's side Whisper (its user transcripts) shares the
   two CPUs with the engine: ``--no-transcripts`` leaves it off, so that the
   difference is the dialect's own. After the speech both are sent silence
   until the first audio comes (the unit loop runs on input), at most
   ``ANSWER_TIMEOUT_S``; a route that gives none is left out of the summary.
2. **Delegation**: 10 spoken requests that need the backend and 10 that do
   not, through Live sessions whose delegation is ``responses`` with a real
   backend (llama-cpp-python's server over SmolLM2, four function tools);
   how many the judge delegated, and for those, the time from the request's
   end to the first spoken word of the backend's answer (the app answers
   each function call with a canned result, as an app would with its own,
   and asks the backend to answer in words, ``tool_choice: none``, as the
   cascade's Live test does: SmolLM2 would call the tool again). The first
   spoken word is the first of the answer's first words (up to three, in
   order) in the model's output transcript after the backend's answer came;
   the acknowledgement and the cascade's own reply before it do not count.
   The same transcripts are then read by the model judge
   (``live.judge.mode = "model"``, the same server) for its counts.

Prints the figures and saves them under benchmarks/results/.

    python -m benchmarks.live_dialect [--questions 4] [--no-transcripts] [--skip-latency]
        [--skip-delegation] [--engine cascade|scripted]

Saved as ``live_dialect_cascade.json``: ``…_no_transcripts`` without the side
Whisper (which also leaves out the delegation part: the judge reads
transcripts), ``…_latency`` or ``…_delegation`` where the other part is skipped.
A run's 1 s units make one pair's difference a unit's either way on the
cascade; on the scripted engine (``--engine scripted``, saved as
``live_dialect_scripted…``) both routes speak in the same unit, so a pair's
difference is what the Live route adds. The figures and what they showed are
in docs/benchmarks/notes.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from openai import AsyncOpenAI
from tests.llm_server import serve_llm
from tests.servers import Server
from tests.speech import silence, speak
from websockets.asyncio.client import connect

from benchmarks.cascade_latency import QUESTIONS
from benchmarks.load import save_result, this_machine
from omnilive.audio import INPUT_RATE, resample
from omnilive.engines.cascade.remote_llm import RemoteChat
from omnilive.live_settings import ServerSettings
from omnilive.protocol.duplex import Prepare
from omnilive.worker.delegation.judge import CueJudge, Delegable, ModelJudge

# Both latency routes get the duplex route's own default prompt (an empty Live
# instructions would be a different prompt, so different work for the engine).
LATENCY_PROMPT = Prepare.model_fields["system_prompt"].default
ANSWER_TIMEOUT_S = 30.0  # after the speech's end, for the first audio (latency)
DELEGATION_TIMEOUT_S = 90.0  # after the request's end, for the answer's first word
SAME_UNIT_MS = 500.0  # a pair's difference under this: both answered in the same unit
QUIET_S = 4.0  # after the last transcript without a delegation: the turn was not delegated
INSTRUCTIONS = (
    "You are a concierge on the phone. Delegate to the backend: weather forecasts, "
    "restaurant bookings, flight status and stock prices. Answer anything else yourself."
)
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather forecast for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"type": "function", "name": "book_table", "description": "Book a table at a restaurant",
     "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}}}},
    {"type": "function", "name": "flight_status", "description": "The status of a flight",
     "parameters": {"type": "object", "properties": {"flight": {"type": "string"}}}},
    {"type": "function", "name": "stock_price", "description": "The price of a stock or share",
     "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}}},
]  # fmt: skip
NEEDS_BACKEND = [
    "What's the weather in Paris tomorrow?",
    "Will it rain in London this afternoon?",
    "Book a table for two at Luigi's at eight.",
    "Can you reserve a restaurant for Friday night?",
    "Is flight BA 117 on time?",
    "When does my flight to Tokyo land?",
    "What is Apple's stock price?",
    "How are Tesla shares doing today?",
    "Is it going to be sunny in Rome this weekend?",
    "Find me a table at a sushi restaurant tonight.",
]
NO_BACKEND = [
    "Tell me a joke about cats.",
    "How are you today?",
    "What is your name?",
    "Thank you very much.",
    "Can you say that again more slowly?",
    "Good morning!",
    "What does the word serendipity mean?",
    "Tell me a fun fact about octopuses.",
    "How do you say hello in Spanish?",
    "I'm just testing the microphone.",
]
CANNED = {"get_weather": "sunny, 21 degrees", "book_table": "booked for eight o'clock",
          "flight_status": "on time", "stock_price": "191 dollars"}  # fmt: skip


def pcm24(audio: np.ndarray) -> str:
    samples = resample(audio, INPUT_RATE, 24_000)
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def f32(audio: np.ndarray) -> str:
    return base64.b64encode(audio.astype("<f4").tobytes()).decode()


def seconds_of(turn: np.ndarray, lead_s: float = 1.0) -> list[np.ndarray]:
    """The turn in whole 1 s pieces: silence, the speech, silence to the second's end."""
    audio = np.concatenate([silence(lead_s), turn])
    audio = np.concatenate([audio, silence(1.0 - (audio.size / INPUT_RATE) % 1.0)])
    return [audio[i : i + INPUT_RATE] for i in range(0, audio.size, INPUT_RATE)]


def start_playing(
    send: Callable[[np.ndarray], Awaitable[None]], turn: np.ndarray, lead_s: float = 1.0
) -> tuple[asyncio.Task[None], float]:
    """Send the turn in 1 s pieces at microphone pace (each once its second
    has passed, as a microphone has it), then silence until cancelled (the
    unit loop runs on input: without it nothing more is said). Returns the
    player and when the speech ends (``time.perf_counter``)."""
    pieces = seconds_of(turn, lead_s)
    started = time.perf_counter()

    async def player() -> None:
        n = 0
        while True:
            await asyncio.sleep(max(0.0, started + n + 1 - time.perf_counter()))
            await send(pieces[n] if n < len(pieces) else silence(1.0))
            n += 1

    task = asyncio.create_task(player(), name="live_dialect:player")
    return task, started + lead_s + turn.size / INPUT_RATE


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def summary(values: list[float]) -> dict[str, Any]:
    """p50, p95, mean and count of ``values`` (ms)."""
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "mean": round(statistics.fmean(values), 1) if values else None,
        "count": len(values),
    }


# --- 1. latency ------------------------------------------------------------------------


async def live_first_audio(server: Server, turn: np.ndarray) -> float:
    """Seconds from the speech's end to the first audio after it (NaN: none
    in time). A plain WebSocket client, as the duplex route's is: the
    ``openai`` SDK's parsing of every event into its types is the client's
    cost, not the dialect's (its own test drives the SDK)."""
    async with connect(f"{server.ws}/v1/live/sessions", max_size=None) as ws:
        session = {"model": "gpt-live-1", "instructions": LATENCY_PROMPT}
        await ws.send(json.dumps({"type": "session.start", "session": session}))
        while (message := json.loads(await ws.recv())).get("type") != "session.started":
            if message.get("type") == "error":
                raise RuntimeError(f"session.start refused: {message}")

        async def send(piece: np.ndarray) -> None:
            append = {"type": "session.input_audio.append", "audio": pcm24(piece)}
            await ws.send(json.dumps(append))

        def answer(raw: Any) -> bool:
            return json.loads(raw).get("type") == "session.output_audio.delta"

        player, ended = start_playing(send, turn)
        return await first_answer_after(player, ended, ws, answer)


async def duplex_first_audio(server: Server, turn: np.ndarray) -> float:
    """Seconds from the speech's end to the first audio after it (NaN: none in time)."""
    url = f"{server.ws}/ws/duplex/bench_{secrets.token_hex(6)}"
    async with connect(url, max_size=None) as ws:
        prepare = {"type": "prepare", "mode": "audio_duplex", "system_prompt": LATENCY_PROMPT}
        await ws.send(json.dumps(prepare))
        while (message := json.loads(await ws.recv())).get("type") != "prepared":
            if message.get("type") == "error":
                raise RuntimeError(f"prepare refused: {message}")

        async def send(piece: np.ndarray) -> None:
            await ws.send(json.dumps({"type": "audio_chunk", "audio_base64": f32(piece)}))

        def answer(raw: Any) -> bool:
            message = json.loads(raw)
            return message.get("type") == "result" and bool(message.get("audio_data"))

        player, ended = start_playing(send, turn)
        return await first_answer_after(player, ended, ws, answer)


async def first_answer_after(
    player: asyncio.Task[Any], ended: float, stream: Any, is_answer: Callable[[Any], bool]
) -> float:
    """Seconds from ``ended`` to the first item of ``stream`` after it that
    ``is_answer`` (NaN: none in time); ``player`` is stopped either way."""
    try:
        async with asyncio.timeout(ended - time.perf_counter() + ANSWER_TIMEOUT_S):
            async for item in stream:
                now = time.perf_counter()
                if is_answer(item) and now >= ended:
                    return now - ended
    except TimeoutError:
        pass
    finally:
        player.cancel()
    return float("nan")


async def latency(server: Server, questions: int) -> dict[str, Any]:
    rows = []
    for n, question in enumerate(QUESTIONS[:questions]):
        turn = speak(question)
        order = ["live", "duplex"] if n % 2 == 0 else ["duplex", "live"]
        row: dict[str, Any] = {"question": question}
        for route in order:
            run = live_first_audio if route == "live" else duplex_first_audio
            row[route] = round(await run(server, turn) * 1000, 1)
            await asyncio.sleep(1.0)
        row["added_ms"] = round(row["live"] - row["duplex"], 1)
        print(row, flush=True)
        rows.append(row)
    answered = [r for r in rows if r["added_ms"] == r["added_ms"]]  # NaN: a route gave none
    added = [r["added_ms"] for r in answered]
    live, duplex = summary([r["live"] for r in answered]), summary([r["duplex"] for r in answered])
    return {
        "rows": rows,
        "pairs": len(answered),
        "unanswered": [r["question"] for r in rows if r not in answered],
        "live_ms": live,
        "duplex_ms": duplex,
        "added_ms": summary(added),
        # The unit loop answers on a 1 s unit: a pair whose routes answered
        # in the same unit differs by under half of one.
        "same_unit_added_ms": summary([a for a in added if abs(a) < SAME_UNIT_MS]),
        "added_minus_p50s_ms": (round(live["p50"] - duplex["p50"], 1) if answered else None),
    }


# --- 2. delegation -----------------------------------------------------------------------


def said_words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


async def delegation_turn(server: Server, request: str) -> dict[str, Any]:
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="x")
    responses = {"model": "smollm2", "tools": TOOLS, "tool_choice": "auto"}
    session = {"model": "gpt-live-1", "instructions": INSTRUCTIONS,
               "delegation": {"type": "responses", "responses": responses}}  # fmt: skip
    result: dict[str, Any] = {"request": request, "delegated": False, "heard": ""}
    async with client.live.connect() as connection:
        await connection.session.start(session=session)  # type: ignore[typeddict-item]
        async for event in connection:
            if event.type == "session.started":
                break
            if event.type == "error":
                raise RuntimeError(f"session.start refused: {event}")
        turn = speak(request)

        async def send(piece: np.ndarray) -> None:
            await connection.session.input_audio.append(audio=pcm24(piece))

        player, ended = start_playing(send, turn)
        answer = ""  # the backend's text, said as commentary once its response completed
        answered_at: float | None = None
        said: list[tuple[float, str]] = []  # words said after the answer came, with their times
        heard_at: float | None = None
        calls = completed = 0

        async def events() -> None:
            nonlocal answer, answered_at, heard_at, calls, completed
            async for event in connection:
                now, kind = time.perf_counter(), event.type
                if kind == "session.input_transcript.delta":
                    result["heard"] = f"{result['heard']} {event.delta}".strip()
                    heard_at = now
                elif kind == "error":
                    result.setdefault("errors", []).append(event.error.message)
                elif kind == "session.delegation.created":
                    result["delegated"] = True
                    result["delegated_after_ms"] = round((now - ended) * 1000)
                elif kind == "response.event":
                    inner = event.event
                    inner_kind = str(inner.get("type"))
                    result.setdefault("backend_events", []).append(inner_kind)
                    if inner_kind == "response.output_item.done":
                        item: Any = inner["item"]
                        if item.get("type") == "function_call":
                            calls += 1
                            output = CANNED.get(item["name"], "done")
                            await connection.response.item.create(item={
                                "type": "function_call_output", "call_id": item["call_id"],
                                "output": output})  # fmt: skip
                            in_words = {"type": "responses", "responses": {"tool_choice": "none"}}
                            await connection.session.update(session={"delegation": in_words})  # type: ignore[typeddict-item]
                            await connection.response.create()
                    elif inner_kind == "response.output_text.delta":
                        answer += str(inner.get("delta", ""))
                    elif inner_kind == "response.completed" and answer.strip() and not answered_at:
                        answered_at = now
                        result["answer_after_ms"] = round((now - ended) * 1000)
                    if inner_kind in ("response.completed", "response.failed"):
                        completed += 1
                        if not answered_at and completed > calls:
                            return  # the backend ended with nothing to say and no call waiting
                elif kind == "session.output_transcript.delta" and answered_at is not None:
                    said.extend((now, w) for w in said_words(event.delta))
                    first = said_words(answer)[:3]
                    words = [w for _, w in said]
                    for at in range(len(words) - len(first) + 1):
                        if first and words[at : at + len(first)] == first:
                            result["to_first_word_ms"] = round((said[at][0] - ended) * 1000)
                            return
                if (
                    not result["delegated"]
                    and heard_at is not None
                    and now - heard_at > QUIET_S
                    and now > ended + QUIET_S
                ):
                    return  # heard and not delegated

        try:
            async with asyncio.timeout(ended - time.perf_counter() + DELEGATION_TIMEOUT_S):
                await events()
        except TimeoutError:
            result["timed_out"] = True
        finally:
            player.cancel()
        result["answer"] = answer.strip()
        result["function_calls"] = calls
        if "backend_events" in result:  # in order, a run of one type as one entry
            runs: list[list[Any]] = []
            for kind in result["backend_events"]:
                if runs and runs[-1][0] == kind:
                    runs[-1][1] += 1
                else:
                    runs.append([kind, 1])
            result["backend_events"] = [k if n == 1 else f"{k} x{n}" for k, n in runs]
    print(result, flush=True)
    return result


async def delegation(server: Server, llm_url: str) -> dict[str, Any]:
    needs = [await delegation_turn(server, r) for r in NEEDS_BACKEND]
    others = [await delegation_turn(server, r) for r in NO_BACKEND]
    delegable = Delegable(INSTRUCTIONS, tuple(TOOLS))
    settings = ServerSettings(url=llm_url)
    judges = {"cues": CueJudge(), "model": ModelJudge(RemoteChat.from_settings(settings))}
    offline: dict[str, dict[str, int]] = {}
    for name, judge in judges.items():
        for r in [*needs, *others]:  # a turn never transcribed is judged on its text
            verdict = judge.judge_now(r["heard"] or r["request"], delegable)
            r[f"{name}_judge"] = {"delegate": verdict.delegate, "why": verdict.why}
        offline[name] = {
            "needs_backend_delegated": sum(r[f"{name}_judge"]["delegate"] for r in needs),
            "no_backend_delegated": sum(r[f"{name}_judge"]["delegate"] for r in others),
        }
    times = [r["to_first_word_ms"] for r in needs if "to_first_word_ms" in r]
    return {
        "needs_backend": needs,
        "no_backend": others,
        "live_cues_judge": {
            "needs_backend_delegated": sum(r["delegated"] for r in needs),
            "no_backend_delegated": sum(r["delegated"] for r in others),
        },
        "judges_on_the_same_transcripts": offline,
        "untranscribed": sum(not r["heard"] for r in [*needs, *others]),
        "to_first_word_of_result_ms": {**summary(times), "all": times},
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"machine": this_machine(), "engine": args.engine}
    figures["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        llm = serve_llm(tmp)
        llm_url = next(llm)
        env = {
            "OMNILIVE_TRANSCRIPTION__WHISPER": "true" if args.transcripts else "false",
            "OMNILIVE_LIVE__BACKEND__URL": llm_url,
            "OMNILIVE_LIVE__BACKEND__STREAM_AUTO_TOOLS": "false",
        }
        server = Server(tmp, engine=args.engine, env=env).start()
        try:
            await server.wait_ready(timeout=240, workers=1)
            if not args.skip_latency:
                figures["latency"] = {
                    "transcripts": args.transcripts,
                    **await latency(server, args.questions),
                }
            if args.transcripts and not args.skip_delegation:
                figures["delegation"] = await delegation(server, llm_url)
            figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        except BaseException:
            print(f"the server's log, the end:\n{server.log()[-6000:]}", file=sys.stderr)
            raise
        finally:
            server.stop()
            llm.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--no-transcripts", dest="transcripts", action="store_false")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-delegation", action="store_true")
    parser.add_argument(
        "--engine",
        default="cascade",
        choices=["cascade", "scripted"],
        help="scripted: the dialect's own cost alone (its units are the same on both "
        "routes, so a pair differs by what the routes add, not by a unit)",
    )
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    name = f"live_dialect_{args.engine}" + ("" if args.transcripts else "_no_transcripts")
    if args.transcripts and (args.skip_latency or args.skip_delegation):
        name += "_delegation" if args.skip_latency else "_latency"
    path = save_result(name, figures)
    print(json.dumps({k: v for k, v in figures.items() if k != "delegation"}, indent=2))
    if "delegation" in figures:
        d = figures["delegation"]
        print(
            json.dumps({k: d[k] for k in d if k not in ("needs_backend", "no_backend")}, indent=2)
        )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
