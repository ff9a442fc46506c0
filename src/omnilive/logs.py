"""Logging set-up: every record carries the session it belongs to.

The session id lives in a context variable. A connection's handler sets it
once (:func:`bind_session`); asyncio copies the context into the tasks it
starts, so every log line of that session, in any of its tasks, names it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar

SESSION_ID: ContextVar[str] = ContextVar("omnilive_session_id", default="-")


def bind_session(session_id: str) -> None:
    """Name the session of the current task (and of the tasks it starts)."""
    SESSION_ID.set(session_id)


class SessionIdFilter(logging.Filter):
    """Adds ``session_id`` (``-`` outside sessions) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id = SESSION_ID.get()
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record, for log shippers."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "session_id": getattr(record, "session_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(
    level: str, component: str, json_lines: bool = False, stream: str = "stderr"
) -> None:
    """The root logger of one process (``component``: gateway, worker, ...),
    writing to ``stream`` (stderr or stdout)."""
    handler = logging.StreamHandler(sys.stdout if stream == "stdout" else sys.stderr)
    handler.addFilter(SessionIdFilter())
    if json_lines:
        handler.setFormatter(JsonLines(component))
    else:
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s %(levelname)s [{component}] %(name)s [%(session_id)s]: %(message)s"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
