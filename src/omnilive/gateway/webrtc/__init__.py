"""WebRTC transport: Opus audio (and the camera, for omni) over a peer
connection, a protocol's JSON events on a data channel, signalled by one HTTP
offer/answer. Behind the transport a call is an ordinary WebSocket session of
its protocol (``call.py`` hands the app an ASGI WebSocket of its own), so the
session path, queue, limits, auth and recording are those of the WebSocket.
``docs/webrtc.md`` documents it."""
