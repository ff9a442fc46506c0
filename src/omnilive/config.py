"""One typed settings object, loaded once in ``main()`` and passed explicitly.

Precedence, lowest to highest: the defaults below, an optional TOML file,
``OMNILIVE_*`` environment variables, command-line flags. Nested sections are
TOML tables (``[eta]``) and double-underscore environment names
(``OMNILIVE_ETA__CHAT_S=20``).

The server's own sections are here; the live sessions' (turn-taking, the
duplex loop, Realtime, WebRTC) are in ``session_settings.py`` and the
engines' in ``engine_settings.py``.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from omnilive.engine_settings import (
    CascadeSettings,
    MiniCPMoSettings,
    ScriptedSettings,
    Section,
    TranscriptionSettings,
)
from omnilive.engines.registry import ENGINE_NAMES, engine_entry
from omnilive.live_settings import LiveSettings
from omnilive.session_settings import (
    DuplexSettings,
    EndOfTurnSettings,
    RealtimeSettings,
    WebRTCSettings,
)

ENV_PREFIX = "OMNILIVE_"
if TYPE_CHECKING:
    EngineName = str
else:
    # The registry's names as a Literal: pydantic refuses any other with the
    # names listed, and the reference page lists them. A type checker cannot
    # read a Literal built at run time, hence a plain str for it.
    EngineName = Literal[ENGINE_NAMES]
RequestType = Literal["chat", "half_duplex", "audio_duplex", "omni_duplex"]
REQUEST_TYPES: tuple[RequestType, ...] = ("chat", "half_duplex", "audio_duplex", "omni_duplex")
# The reference calls half-duplex "half_duplex_audio" (its app id, preset folder
# and queue request type); clients of it send and read that name.
_REFERENCE_NAMES = {"half_duplex": "half_duplex_audio"}


def reference_name(name: str) -> str:
    """The reference's name for one of our app, mode or request-type names."""
    return _REFERENCE_NAMES.get(name, name)


def our_name(name: str) -> str:
    """Our name for a name given our way or the reference's."""
    return next((ours for ours, theirs in _REFERENCE_NAMES.items() if theirs == name), name)


class EtaSettings(Section):
    """Queue wait estimates: configured baselines until enough samples exist, then an EMA."""

    chat_s: float = Field(15.0, gt=0, description="Baseline duration of a chat request.")
    half_duplex_s: float = Field(180.0, gt=0, description="Baseline of a half-duplex session.")
    audio_duplex_s: float = Field(120.0, gt=0, description="Baseline of an audio duplex session.")
    omni_duplex_s: float = Field(90.0, gt=0, description="Baseline of an omni duplex session.")
    ema_alpha: float = Field(0.3, gt=0, le=1, description="Weight of the newest observation.")
    ema_min_samples: int = Field(3, ge=1, description="Samples needed before the EMA is used.")
    overrun_floor_s: float = Field(
        15.0, ge=0, description="Remaining time assumed for a session already past its baseline."
    )

    def baseline(self, request_type: RequestType) -> float:
        return float(getattr(self, f"{request_type}_s"))


class LimitSettings(Section):
    """Bounds on what a client may send; each refusal names the limit it hit."""

    max_message_bytes: int = Field(64 * 1024 * 1024, description="Largest WebSocket message.")
    max_chat_messages: int = Field(256, description="Messages in one chat request.")
    max_chat_audio_s: float = Field(600.0, description="Total audio seconds in one chat request.")
    max_chunk_audio_s: float = Field(4.0, gt=0, description="Audio in one duplex chunk.")
    max_frames_per_chunk: int = Field(8, ge=0, description="Video frames in one duplex chunk.")
    max_frame_bytes: int = Field(2 * 1024 * 1024, gt=0, description="Size of one JPEG frame.")
    max_session_timeout_s: float = Field(
        900.0, gt=0, description="Cap on a half-duplex session's inactivity timeout."
    )
    first_message_timeout_s: float = Field(30.0, description="Wait for a client's first message.")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Time a connection has to send a whole request head (its HTTP "
        "headers, a WebSocket upgrade included) before it is closed.",
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest a request body may pause (no part of it arriving) before "
        "the request is refused (408 timeout): a body announced but never sent "
        "holds nothing for long.",
    )
    max_prepare_audio_s: float = Field(
        120.0, gt=0, description="Audio in one prepare (reference voice and system audio)."
    )
    max_sessions_per_key: int = Field(
        8, ge=0, description="Sessions one API key may hold at once (0: no limit)."
    )
    requests_per_minute_per_key: int = Field(
        600, ge=0, description="Requests one API key may make per minute (0: no limit)."
    )
    resume_grace_s: float = Field(
        30.0,
        ge=0,
        description="How long a streaming session whose client connection dropped is held "
        "(suspended) for a resume with its token (0: no resume; a drop ends the session).",
    )
    resume_buffer_events: int = Field(
        2048, ge=16, description="Server events a session keeps for replay after a resume."
    )
    resume_buffer_bytes: int = Field(
        16 * 1024 * 1024, ge=64 * 1024, description="Bytes of server events kept for replay."
    )


class ApiKey(Section):
    """One API key: its secret, its role and, optionally, its own limits."""

    key: str = Field(min_length=16, description="The secret clients send as a Bearer token.")
    role: Literal["user", "admin"] = Field("user", description="admin may also use admin routes.")
    name: str = Field("", description="Shown in logs and metrics instead of the key.")
    expires_at: float | None = Field(None, description="Unix time after which it is refused.")
    max_sessions: int | None = Field(None, ge=0, description="Overrides the per-key default.")
    requests_per_minute: int | None = Field(None, ge=0, description="Overrides the default.")


class AuthSettings(Section):
    """Who may use the gateway. With no keys at all the gateway is open, and
    then it must stay on loopback unless ``insecure`` (``--insecure``) is set."""

    keys: list[ApiKey] = Field(default_factory=list, description="API keys (JSON in the env).")
    keys_file: Path | None = Field(
        None, description="More keys, one per line: KEY ROLE [NAME]; # starts a comment."
    )
    token_ttl_s: float = Field(600.0, gt=0, description="Default life of a client token.")
    max_token_ttl_s: float = Field(3600.0, gt=0, description="Longest life a client may ask for.")
    token_secret: str = Field(
        "", description="HMAC secret of client tokens; empty: a random one per gateway process."
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed besides the gateway's own (scheme://host[:port]; "
        "* for any) for WebSocket upgrades and state-changing requests.",
    )
    insecure: bool = Field(
        False, description="Allow an open gateway (no keys) on a non-loopback address."
    )


class RecordingSettings(Section):
    """Session recordings under ``data_dir/sessions`` and their cleanup."""

    enabled: bool = Field(True, description="Record sessions (clients may still opt out).")
    retention_days: float = Field(30.0, gt=0, description="Delete recordings older than this.")
    max_storage_gb: float = Field(50.0, gt=0, description="Delete oldest recordings above this.")
    cleanup_interval_s: float = Field(86400.0, gt=0, description="Period of automatic cleanup.")
    max_upload_mb: float = Field(200.0, gt=0, description="Cap on browser-side recording uploads.")
    max_comment_chars: int = Field(2000, gt=0, description="Cap on a session comment.")
    writer_queue: int = Field(256, ge=8, description="Pending writes per worker before blocking.")


class PresetSettings(Section):
    """Presets (system prompt and voice per mode): the built-in ones plus users' folders."""

    dirs: list[Path] = Field(
        default_factory=list,
        description="Folders of preset YAML files (``<mode>/<id>.yaml``), merged over the "
        "built-in ones in order; a preset with the same mode and id replaces the earlier one.",
    )


class PageSettings(Section):
    """Defaults the browser pages start from (``GET /api/frontend_defaults``)."""

    playback_delay_ms: int = Field(
        200, ge=0, le=2000, description="Delay before playing the first audio of an answer."
    )
    default_lang: Literal["en", "zh"] | None = Field(
        None, description="Language of the pages when the browser has not chosen one."
    )


class VoiceSettings(Section):
    """Uploaded reference voices under ``data_dir/ref_audio``."""

    max_upload_mb: float = Field(20.0, gt=0, description="Largest uploaded audio file.")
    max_duration_s: float = Field(60.0, gt=0, description="Longest reference voice.")
    min_duration_s: float = Field(0.5, ge=0, description="Shortest reference voice.")
    max_count: int = Field(500, ge=1, description="Stored voices; further uploads are refused.")
    decode_timeout_s: float = Field(30.0, gt=0, description="Longest ffmpeg may take to decode.")
    default_espeak_voice: str = Field(
        "en-us", description="espeak-ng voice of the default sample when the engine has none."
    )


class RaySettings(Section):
    """Running on a Ray cluster (``serve --ray``, ``gateway --ray``; the ``[ray]`` extra)."""

    enabled: bool = Field(False, description="Workers are Ray actors; the queue is one actor.")
    address: str = Field(
        "",
        description="Cluster to join (host:port, or auto); empty: `serve` starts a local one.",
    )
    namespace: str = Field("omnilive", description="Ray namespace of this deployment's actors.")
    worker_gpus: float | None = Field(
        None,
        ge=0,
        description="GPUs per worker actor: one worker per that many GPUs of the cluster, "
        "following it as nodes join; 0: `workers` CPU actors; unset: 1 for minicpmo, else 0.",
    )
    worker_cpus: float = Field(1.0, ge=0, description="CPUs each worker actor reserves.")
    worker_host: str = Field(
        "", description="Address worker actors bind; empty: their node's IP as Ray sees it."
    )
    max_restarts: int = Field(
        -1, ge=-1, description="Restarts Ray gives a worker actor (-1: no limit)."
    )
    placement_interval_s: float = Field(
        2.0, gt=0, description="How often the cluster's GPUs are counted for new workers."
    )
    gateway_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A gateway silent this long is gone: its tickets and leases are dropped.",
    )
    object_store_mb: int = Field(
        128, ge=64, description="Object store of a local cluster (queue traffic is small)."
    )

    def gpus_per_worker(self, engine: str) -> float:
        if self.worker_gpus is not None:
            return self.worker_gpus
        return engine_entry(engine).gpus


class Settings(Section):
    """Everything a gateway or worker process needs, with the defaults of the spec."""

    host: str = Field("127.0.0.1", description="Gateway bind address.")
    port: int = Field(8006, ge=0, le=65535, description="Gateway port.")
    # uvicorn's names. TLS is for the public gateway port only: workers stay
    # plain WebSockets on loopback, behind the internal token.
    ssl_certfile: Path | None = Field(
        None, description="PEM certificate (and chain): the gateway serves HTTPS and WSS."
    )
    ssl_keyfile: Path | None = Field(
        None, description="PEM private key of ssl_certfile (unless that file holds it)."
    )
    ssl_self_signed: bool = Field(
        False,
        description="Serve HTTPS with a self-signed certificate made once in data_dir/tls "
        "(browsers warn); for a LAN or a demo.",
    )
    ws_compression: bool = Field(
        False,
        description="Offer permessage-deflate on WebSockets. Off: base64 media shrinks only "
        "~25% for ~11 ms of deflate per 400 kB at each end, time a live answer waits for.",
    )
    engine: EngineName = Field("cascade", description="Engine the workers load.")
    workers: int = Field(1, ge=0, description="Worker processes `serve` starts.")
    worker_host: str = Field("127.0.0.1", description="Address workers bind.")
    worker_base_port: int = Field(22400, ge=0, le=65535, description="Port of worker 0.")
    worker_urls: list[str] = Field(
        default_factory=list,
        description="Workers the gateway uses (`omnilive gateway`); `serve` fills this in.",
    )
    internal_token: str = Field("", description="Shared secret between gateway and workers.")
    binary_media: bool = Field(
        True,
        description="The gateway sends a worker each duplex and half-duplex audio_chunk as one "
        "binary frame, its media decoded from base64 (the worker's event loop then parses "
        "neither); off: as the client's JSON text (both reach the same checks).",
    )
    data_dir: Path = Field(Path("data"), description="Recordings, caches and state.")
    max_queue_size: int = Field(1000, ge=0, description="Tickets the queue holds.")
    request_timeout_s: float = Field(300.0, gt=0, description="Longest a chat request may run.")
    queue_update_interval_s: float = Field(3.0, gt=0, description="Period of queue_update.")
    health_interval_s: float = Field(10.0, gt=0, description="Worker health-check period.")
    health_timeout_s: float = Field(5.0, gt=0, description="Worker health-check timeout.")
    restart_backoff_max_s: float = Field(30.0, gt=0, description="Longest worker restart delay.")
    max_failed_loads: int = Field(
        3, ge=1, description="`serve` gives up on a worker after this many failed loads in a row."
    )
    log_level: str = Field("info", description="debug, info, warning or error.")
    log_json: bool = Field(False, description="Log JSON lines instead of text.")
    log_stream: Literal["stderr", "stdout"] = Field(
        "stderr",
        description="Where the log goes: stderr, or stdout (the container images: a "
        "container's log is its output). One-line start-up errors stay on stderr.",
    )
    auth: AuthSettings = Field(default_factory=AuthSettings)
    eta: EtaSettings = Field(default_factory=EtaSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    recording: RecordingSettings = Field(default_factory=RecordingSettings)
    duplex: DuplexSettings = Field(default_factory=DuplexSettings)
    end_of_turn: EndOfTurnSettings = Field(default_factory=EndOfTurnSettings)
    realtime: RealtimeSettings = Field(default_factory=RealtimeSettings)
    transcription: TranscriptionSettings = Field(default_factory=TranscriptionSettings)
    live: LiveSettings = Field(default_factory=LiveSettings)
    presets: PresetSettings = Field(default_factory=PresetSettings)
    voices: VoiceSettings = Field(default_factory=VoiceSettings)
    pages: PageSettings = Field(default_factory=PageSettings)
    webrtc: WebRTCSettings = Field(default_factory=WebRTCSettings)
    scripted: ScriptedSettings = Field(default_factory=ScriptedSettings)
    cascade: CascadeSettings = Field(default_factory=CascadeSettings)
    minicpmo: MiniCPMoSettings = Field(default_factory=MiniCPMoSettings)
    ray: RaySettings = Field(default_factory=RaySettings)

    @field_validator("ssl_keyfile")
    @classmethod
    def _key_needs_certificate(cls, keyfile: Path | None, info: ValidationInfo) -> Path | None:
        if keyfile is not None and info.data.get("ssl_certfile") is None:
            raise PydanticCustomError("tls", "needs ssl_certfile, the certificate it belongs to")
        return keyfile

    @field_validator("ssl_self_signed")
    @classmethod
    def _one_source_of_certificate(cls, self_signed: bool, info: ValidationInfo) -> bool:
        given = [name for name in ("ssl_certfile", "ssl_keyfile") if info.data.get(name)]
        if self_signed and given:
            raise PydanticCustomError(
                "tls",
                "cannot be combined with {given}: a certificate is either made here "
                "or given, not both",
                {"given": " and ".join(given)},
            )
        return self_signed

    def to_json(self) -> str:
        return self.model_dump_json()


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """``OMNILIVE_ETA__CHAT_S=20`` → ``{"eta": {"chat_s": "20"}}``; lists as JSON."""
    layer: dict[str, Any] = {}
    known = set(Settings.model_fields)
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if path[0] not in known:
            continue
        value: Any = raw
        if path == ["worker_urls"]:
            value = json.loads(raw) if raw.startswith("[") else [u for u in raw.split(",") if u]
        elif path in (["auth", "keys"], ["webrtc", "ice_servers"]):  # JSON lists of objects
            value = json.loads(raw)
        elif path == ["auth", "allowed_origins"]:
            value = json.loads(raw) if raw.startswith("[") else [o for o in raw.split(",") if o]
        elif path == ["presets", "dirs"]:  # like PATH: os.pathsep between folders
            folders = raw.split(os.pathsep)
            value = json.loads(raw) if raw.startswith("[") else [d for d in folders if d]
        _set_path(layer, path, value)
    return layer


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge defaults, TOML file, environment and flags (flags win).

    ``overrides`` uses dotted keys for nested fields (``{"eta.chat_s": 20}``);
    ``None`` values mean "flag not given".
    """
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    if config_file is not None:
        with open(config_file, "rb") as fh:
            merged = _deep_merge(merged, tomllib.load(fh))
    merged = _deep_merge(merged, _env_layer(environ))
    flags: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(flags, dotted.split("."), value)
    merged = _deep_merge(merged, flags)
    return Settings.model_validate(merged)
