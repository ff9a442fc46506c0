"""One-time credentials for the sessions of WebRTC calls run by media
processes (``docs/webrtc.md``).

A call's signalling request is checked as any request is (its key or client
token, its origin, the rate limit). Its session then comes back to the
gateway from a media process, as a WebSocket to the session's route; that
socket carries a pass minted here for the caller and that route, in
:data:`PASS_HEADER`. The gatekeeper takes the pass as the caller's own
credential, so the session counts against the caller's key (its concurrent
sessions, its rate) exactly as the call's in-process session does. A pass
opens one WebSocket, on its route, within :data:`PASS_TTL_S`; it is random
(256 bits) and never leaves the host.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from omnilive.gateway.credentials import Principal

PASS_HEADER = "x-omnilive-call-pass"
# A media process opens the session as soon as it has answered the offer.
PASS_TTL_S = 30.0
MAX_OUTSTANDING = 4096  # more unredeemed passes than that: the oldest lapse


@dataclass(frozen=True)
class CallPass:
    principal: Principal
    path: str
    expires_at: float


class CallPasses:
    """Passes minted and not yet redeemed, oldest first."""

    def __init__(
        self,
        ttl_s: float = PASS_TTL_S,
        max_outstanding: int = MAX_OUTSTANDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_outstanding = max_outstanding
        self._clock = clock
        self._passes: dict[str, CallPass] = {}

    def __len__(self) -> int:
        return len(self._passes)

    def mint(self, principal: Principal, path: str) -> str:
        """A pass for ``principal`` to open one session on the route ``path``."""
        now = self._clock()
        self._lapse(now)
        while len(self._passes) >= self.max_outstanding:
            del self._passes[next(iter(self._passes))]
        secret = secrets.token_urlsafe(32)
        self._passes[secret] = CallPass(principal, path, now + self.ttl_s)
        return secret

    def redeem(self, secret: str, path: str) -> Principal | None:
        """The caller ``secret`` was minted for, once, on its own route; None
        for a pass unknown, used, lapsed, or for another route."""
        found = self._passes.pop(secret, None)
        if found is None or found.path != path or found.expires_at < self._clock():
            return None
        return found.principal

    def _lapse(self, now: float) -> None:
        # Minted in order with one lifetime: the lapsed ones are the oldest.
        while self._passes:
            oldest = next(iter(self._passes))
            if self._passes[oldest].expires_at >= now:
                return
            del self._passes[oldest]
