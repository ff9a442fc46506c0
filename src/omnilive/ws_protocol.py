"""The WebSocket protocol omnilive serves with: uvicorn's own, telling a
connection that was lost from one that was closed.

A session's client leaving reaches the app as ``websocket.disconnect`` with
a close code, and the resume rule (``docs/resume.md``) turns on it: any Close
frame ends the session, a connection lost without one is held for a resume.
uvicorn's sans-I/O protocol reports a lost connection as 1005, which is also
the code of an empty Close frame (OpenAI's JS SDK closes with one), so the
two could not be told apart. Here a connection lost with no Close frame
either way, or one whose keepalive ping went unanswered, is 1006 (abnormal
closure, RFC 6455 section 7.1.5).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

CLOSE_ABNORMAL = 1006


class LossAwareWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol with lost connections said as 1006."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unanswered_ping = False

    def keepalive_timeout(self) -> None:
        self._unanswered_ping = True  # the peer is gone, though the server sends the close
        super().keepalive_timeout()

    def connection_lost(self, exc: Exception | None) -> None:
        no_close_frame = self.conn.close_rcvd is None and self.conn.close_sent is None
        if self.handshake_complete and (no_close_frame or self._unanswered_ping):
            # Read before the 1005 that uvicorn queues next: the app sees this one.
            self.queue.put_nowait({"type": "websocket.disconnect", "code": CLOSE_ABNORMAL})
        super().connection_lost(exc)
