"""``omnilive talk``: a conversation with a running server from the terminal.

It listens on the microphone and speaks on the speaker (``sounddevice``:
``pip install 'omnilive[talk]'``), or reads ``--input FILE.wav`` and writes
the model's speech to ``--output FILE.wav`` (machines without audio devices,
tests). It shows the queue, what the server hears (VAD), what the model says
as it says it, and how long each answer took to start. Ctrl-C ends the
session cleanly: the server is told (``stop``) before the program exits.

Exit codes: 0 the conversation ended (Ctrl-C included); 2 bad arguments, an
unreadable input file, or no audio devices; 3 the server refused or failed
the session (the error's code is printed); 1 a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TextIO

from omnilive.audio import AudioDecodeError
from omnilive.client.connection import DEFAULT_URL
from omnilive.client.errors import OmniliveError
from omnilive.client.talk_io import (
    DevicesUnavailable,
    FileSink,
    FileSource,
    Microphone,
    Sink,
    Source,
    Speaker,
)
from omnilive.client.talk_modes import CONVERSATIONS, TalkOptions
from omnilive.client.talk_view import TalkView
from omnilive.tasks import leaf_errors

PROG = "omnilive talk"
EXIT_OK, EXIT_BUG, EXIT_USAGE, EXIT_SERVER = 0, 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("OMNILIVE_URL", DEFAULT_URL),
        help=f"the server (default: $OMNILIVE_URL or {DEFAULT_URL})",
    )
    parser.add_argument(
        "--mode", choices=sorted(CONVERSATIONS), default="half_duplex", help="the conversation"
    )
    parser.add_argument(
        "--key", default=os.environ.get("OMNILIVE_API_KEY"), help="API key ($OMNILIVE_API_KEY)"
    )
    parser.add_argument("--token", help="a client token instead of a key")
    parser.add_argument("--voice", metavar="ID", help="a stored voice (/api/assets/ref_audio)")
    parser.add_argument("--system", metavar="PROMPT", help="the system prompt")
    parser.add_argument("--input", type=Path, metavar="FILE.wav", help="speak this file")
    parser.add_argument("--output", type=Path, metavar="FILE.wav", help="write the answers here")
    parser.add_argument(
        "--max-wait",
        type=float,
        default=60.0,
        metavar="S",
        help="with --input: how long to wait for the answer once the file is over",
    )
    parser.add_argument("--frame", type=Path, metavar="FILE.jpg", help="omni: a still camera frame")
    parser.add_argument(
        "--no-echo-guard",
        dest="echo_guard",
        action="store_false",
        help="keep the microphone open while the model speaks (headphones)",
    )


def run(args: argparse.Namespace) -> int:
    """The command; see the module docstring for its exit codes."""
    if args.input is not None and not args.input.is_file():
        print(f"{PROG}: no such file: {args.input}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(talk(args, sys.stdout))
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C: the session was stopped on the way out


def _options(args: argparse.Namespace) -> TalkOptions:
    return TalkOptions(
        url=args.url,
        mode=args.mode,
        key=args.key,
        token=args.token,
        voice=args.voice,
        system=args.system,
        max_wait_s=args.max_wait,
        echo_guard=args.echo_guard,
        frame=args.frame.read_bytes() if args.frame else None,
    )


def _devices(args: argparse.Namespace) -> tuple[Source, Sink]:
    endless = args.mode in ("duplex", "omni")  # the unit loop needs audio while it answers
    source: Source = FileSource(args.input, endless=endless) if args.input else Microphone()
    try:
        sink: Sink = FileSink(args.output) if args.output else Speaker()
    except DevicesUnavailable:
        source.close()
        raise
    return source, sink


async def talk(args: argparse.Namespace, out: TextIO) -> int:
    try:
        options = _options(args)
        source, sink = _devices(args)
    except (DevicesUnavailable, AudioDecodeError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    view = TalkView(out)
    conversation = CONVERSATIONS[args.mode](options, view, source, sink)
    try:
        ending = await conversation.run()
    except asyncio.CancelledError:  # Ctrl-C: the session was stopped on the way out
        view.line(f"session ended: {conversation.ending()} (Ctrl-C)")
        raise
    except Exception as exc:  # a TaskGroup's errors come grouped: report the first
        error = next((e for e in leaf_errors(exc) if isinstance(e, OmniliveError)), None)
        if error is None:
            raise
        view.line(f"session ended: {error.code}")
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_SERVER
    finally:
        source.close()
        sink.close()
        if isinstance(sink, FileSink):
            view.line(f"wrote {sink.path} ({sink.seconds:.1f} s of speech)")
    view.line(f"session ended: {ending}")
    if view.latencies:
        mean = sum(view.latencies) / len(view.latencies)
        view.line(f"latency: {mean:.2f} s on average over {len(view.latencies)} turn(s)")
    return EXIT_OK
