"""WebRTC transport: Opus audio (and the camera, for omni) over a peer
connection, a protocol's JSON events on a data channel, signalled by one HTTP
offer/answer. Behind the transport a call is an ordinary WebSocket session of
its protocol (``call.py`` hands the app an ASGI WebSocket of its own), so the
session path, queue, limits, auth and recording are those of the WebSocket.
``docs/webrtc.md`` documents it."""

from __future__ import annotations

import importlib


def missing() -> str | None:
    """Why WebRTC cannot run in this installation (aiortc or PyAV absent, as
    on a GPU machine set up without them), or None. The gateway then serves
    every mode over the WebSocket and refuses calls with ``webrtc_unavailable``."""
    for package in ("aiortc", "av"):
        try:
            importlib.import_module(package)
        except ImportError as exc:
            return f"{package} cannot be imported ({exc})"
    return None
