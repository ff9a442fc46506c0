"""Wall-clock times as the API shows them."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float) -> str:
    """``2026-11-23T23:45:01.123+00:00``: an epoch time as ISO 8601, UTC."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def iso_or_none(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)
