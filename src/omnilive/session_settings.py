"""The live sessions' settings sections (``[end_of_turn]``, ``[duplex]``,
``[realtime]``, ``[webrtc]``): when a half-duplex turn is over, the duplex
unit loop, the Realtime API's limits and the WebRTC transport. ``config.py``
gathers them, with the server's own and the engines' (``engine_settings.py``),
into one ``Settings``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from omnilive.engine_settings import Section


class EndOfTurnSettings(Section):
    """Half-duplex turn-taking by meaning, on every engine: every
    ``check_after_ms`` of silence a semantic end-of-turn model (Smart Turn v3)
    judges whether the speaker has finished; a turn judged finished
    ``confirmations`` times in a row is answered at once, any other waits for
    the session's silence rule (its ``min_silence_duration_ms``). An engine
    that understands the words (the cascade) judges them too, and its
    verdict leads (``words_threshold``, ``audio_veto``); a turn whose words
    are plainly unfinished may wait longer than the rule
    (``unfinished_wait_ms``) where the client left the rule to the server."""

    enabled: bool = Field(True, description="Judge turns by meaning (off: silence alone).")
    check_after_ms: int = Field(
        200, ge=50, le=5000, description="Silence after which the model judges the turn."
    )
    words_check_after_ms: int = Field(
        100,
        ge=20,
        le=5000,
        description="Where the engine judges the words it heard (the cascade), the silence "
        "after which the turn is first checked, sooner than check_after_ms: the words do not "
        "change with more silence (later checks come every check_after_ms).",
    )
    threshold: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="Probability of a finished turn above which it is answered at once.",
    )
    model_path: Path | None = Field(
        None, description="The model's .onnx; none: the one in the pipecat-ai wheel."
    )
    confirmations: int = Field(
        2,
        ge=1,
        le=10,
        description="Consecutive judgements of one silence that must find the turn finished "
        "(1: the first decides; more: fewer speakers cut off mid-sentence, each later by "
        "check_after_ms).",
    )
    threads: int = Field(1, ge=1, description="CPU threads of one judgement.")
    words_threshold: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Where the engine also judges the words it heard (the cascade: its "
        "language model's chance that the message ends there, read from the bare words "
        "and, where the transcript closes with a question mark, after it), the turn is finished "
        "when that chance reaches this, once (the words do not change with more silence), "
        "unless the audio model vetoes it.",
    )
    audio_veto: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="With the words judged, the audio model's probability below which it "
        "still holds the turn open (a voice that plainly goes on). 0: the words decide "
        "alone and the audio model is not run (on Piper's voice it gave finished "
        "questions 0.008 and 0.06).",
    )
    unfinished_wait_ms: int = Field(
        1600,
        ge=0,
        le=10_000,
        description="The longest silence a turn whose words are judged unfinished is waited "
        "for, in sessions whose client does not set min_silence_duration_ms (a client's own "
        "rule is always the longest wait): mid-sentence pauses of 0.8-1.0 s are not cut. A "
        "turn no words were judged for still ends at the session's silence rule, and so does "
        "one whose client stops sending audio after that rule's silence. 0: the spec's "
        "800 ms for every turn.",
    )


class DuplexSettings(Section):
    """The full-duplex unit loop."""

    max_pending_chunks: int = Field(
        2, ge=1, description="Chunks waiting for the model; older ones are dropped beyond this."
    )
    idle_timeout_s: float = Field(60.0, gt=0, description="End a session that sends no audio.")
    pause_timeout_s: float = Field(60.0, gt=0, description="Default pause before release.")
    max_pause_s: float = Field(300.0, gt=0, description="Cap on a client-chosen pause timeout.")


class RealtimeSettings(Section):
    """The Realtime API's fixed limits (configurable here for tests and operators)."""

    video_max_s: float = Field(300.0, gt=0, description="Total life of a video session.")
    audio_max_s: float = Field(600.0, gt=0, description="Total life of an audio session.")
    chat_max_s: float = Field(600.0, gt=0, description="Total life of a chat session.")
    chat_idle_s: float = Field(
        120.0, gt=0, description="A chat session that asks nothing for this long ends."
    )
    context_tokens: int = Field(8192, gt=0, description="KV-cache size that ends a session.")


class IceServer(Section):
    """A STUN or TURN server, in the shape of the browser's ``RTCIceServer``."""

    urls: list[str] = Field(
        min_length=1, description="stun:host:port, turn:host:port?transport=udp"
    )
    username: str | None = Field(None, description="TURN user name.")
    credential: str | None = Field(None, description="TURN password.")


class WebRTCSettings(Section):
    """WebRTC transport (``docs/webrtc.md``): Opus audio and a data channel
    beside the WebSocket, for browsers and ``POST /v1/realtime/calls``."""

    enabled: bool = Field(True, description="Serve the WebRTC signalling endpoints.")
    ice_servers: list[IceServer] = Field(
        default_factory=list,
        description="STUN/TURN servers for the gateway and the pages (none: host candidates "
        "only, enough on a LAN or localhost; a NAT'd deployment needs STUN and usually TURN).",
    )
    max_peer_connections: int = Field(
        32, ge=0, description="Peer connections the gateway holds at once; more get 503."
    )
    connect_timeout_s: float = Field(
        15.0, gt=0, description="A call whose ICE/DTLS has not connected by then is closed."
    )
    max_pending_events: int = Field(
        256, ge=8, description="Server events held until the data channel opens; more end it."
    )
    jitter_packets: int = Field(
        0,
        ge=0,
        le=16,
        description="Microphone Opus packets (20 ms each) held against network jitter and "
        "reordering before decoding (0: none, each packet decoded as it comes and a "
        "reordered one dropped); raise it for lossy networks (aiortc's own default: 4).",
    )
    max_audio_backlog_s: float = Field(
        2.0, gt=0, description="Microphone audio the session may fall behind; older is dropped."
    )
    media_processes: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        "auto",
        description="Processes that run the calls' media (Opus, SRTP, DTLS, the camera), each "
        "call's session a loopback WebSocket to the gateway; 0: in the gateway's own process. "
        "auto: 0 on a host of 2 cores or fewer, else half its cores.",
    )

    def media_process_count(self, cpus: int | None = None) -> int:
        """How many media processes to run on a host of ``cpus`` cores (this one's
        by default): ``media_processes``, with ``auto`` resolved (the class's field)."""
        if self.media_processes != "auto":
            return self.media_processes
        cores = cpus if cpus is not None else (os.cpu_count() or 1)
        return 0 if cores <= 2 else cores // 2
