"""Unguessable identifiers. Session ids double as recording links, so they come
from ``secrets`` and never from clocks or counters alone."""

from __future__ import annotations

import re
import secrets
import time

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def mint(prefix: str, nbytes: int = 12) -> str:
    """``prefix_<random>``: 96 bits of randomness by default."""
    return f"{prefix}_{secrets.token_urlsafe(nbytes)}"


def mint_realtime() -> str:
    """``rt_{timestamp_ms}_<random>``: the spec's shape, made unguessable."""
    return f"rt_{int(time.time() * 1000)}_{secrets.token_urlsafe(9)}"


def is_safe_id(value: str) -> bool:
    """True for ids that are safe as a single path component."""
    return bool(_SAFE_ID.match(value))
