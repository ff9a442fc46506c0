"""The client needs nothing of the server side: importing it (and the talk
command) loads no web framework, no engine, and no audio device library."""

from __future__ import annotations

import subprocess
import sys

SERVER_SIDE = ("fastapi", "starlette", "uvicorn", "omnilive.gateway", "omnilive.worker",
               "omnilive.engines", "sounddevice")  # fmt: skip


def test_importing_the_client_loads_nothing_of_the_server():
    probe = (
        "import sys, omnilive.client, omnilive.client.talk\n"
        f"print(sorted(m for m in sys.modules if m.startswith({SERVER_SIDE!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
