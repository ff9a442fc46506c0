"""The load faults the scripted engine fakes when tests ask
(``scripted.load_fault``): each way a real engine's load can go wrong."""

from __future__ import annotations

import os
import signal
import time

from omnilive.engines.base import EngineUnavailable


def fail_load(fault: str) -> None:
    """The load faults tests ask for: a crash as a native library's would be
    (the process dies by a signal), a configuration problem, a bug."""
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5)  # the signal arrives asynchronously
    if fault == "unavailable":
        raise EngineUnavailable("scripted load fault: the configured model is missing")
    raise RuntimeError("scripted load fault: a bug while loading")
