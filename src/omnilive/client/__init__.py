"""An asyncio client for omnilive servers: one class per mode, typed events.

- :class:`Chat` — turn-based chat (``/ws/chat``): text, image, audio, video in; text and speech out.
- :class:`HalfDuplex` — hands-free turns (``/ws/half_duplex``): the server's VAD takes turns.
- :class:`Duplex` — full duplex, audio or omni (``/ws/duplex``): 1 s units, listen or speak.
- :class:`Realtime` — the Realtime API (``/v1/realtime``), both dialects, chat included.

Messages out are built and checked with the server's own protocol models
(``omnilive.protocol``); messages in are the events of ``events.py``; errors
are the exceptions of ``errors.py``, one per error code. Audio is numpy
float32, mono: 16 kHz in, 24 kHz out (``audio.py`` reads and writes WAV
files and resamples). Nothing here needs more than the package's own
dependencies; ``omnilive talk`` adds ``sounddevice`` for a microphone.
"""

from omnilive.client import errors  # every exception, one per error code
from omnilive.client.audio import (
    INPUT_RATE,
    OUTPUT_RATE,
    chunks,
    load_wav,
    read_wav_file,
    resample,
    silence,
    write_wav,
)
from omnilive.client.chat import Chat, ChatAnswer, assistant, audio, image, system, user, video
from omnilive.client.connection import DEFAULT_URL, ClientToken, client_token
from omnilive.client.duplex import Duplex
from omnilive.client.errors import OmniliveError
from omnilive.client.events import (
    AudioDelta,
    ChatDone,
    Chunk,
    Event,
    Generating,
    Interrupted,
    Listen,
    Paused,
    PlaybackApplied,
    PrefillDone,
    Prepared,
    Queued,
    QueueDone,
    QueueUpdate,
    ResponseCancelled,
    ResponseDone,
    Result,
    Resumed,
    ServerError,
    SessionClosed,
    SessionCreated,
    SessionResumed,
    SessionTimeout,
    SessionUpdated,
    Speech,
    Stopped,
    TextDelta,
    TurnDone,
    UnknownEvent,
    Updated,
    VadState,
)
from omnilive.client.half_duplex import HalfDuplex
from omnilive.client.machine import QueueStatus, SessionState
from omnilive.client.realtime import Realtime
from omnilive.client.session import ConnectOptions, Session, Voice

__all__ = [
    "DEFAULT_URL",
    "INPUT_RATE",
    "OUTPUT_RATE",
    "AudioDelta",
    "Chat",
    "ChatAnswer",
    "ChatDone",
    "Chunk",
    "ClientToken",
    "ConnectOptions",
    "Duplex",
    "Event",
    "Generating",
    "HalfDuplex",
    "Interrupted",
    "Listen",
    "OmniliveError",
    "Paused",
    "PlaybackApplied",
    "PrefillDone",
    "Prepared",
    "QueueDone",
    "QueueStatus",
    "QueueUpdate",
    "Queued",
    "Realtime",
    "ResponseCancelled",
    "ResponseDone",
    "Result",
    "Resumed",
    "ServerError",
    "Session",
    "SessionClosed",
    "SessionCreated",
    "SessionResumed",
    "SessionState",
    "SessionTimeout",
    "SessionUpdated",
    "Speech",
    "Stopped",
    "TextDelta",
    "TurnDone",
    "UnknownEvent",
    "Updated",
    "VadState",
    "Voice",
    "assistant",
    "audio",
    "chunks",
    "client_token",
    "errors",
    "image",
    "load_wav",
    "read_wav_file",
    "resample",
    "silence",
    "system",
    "user",
    "video",
    "write_wav",
]
