"""The cascade loads and works with the network cut: nothing is fetched at run time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from omnilive.engines.cascade import CascadeEngine
from tests.cascade.speech import overlap

pytestmark = pytest.mark.cascade

# Loaded through PYTHONPATH before anything else: every socket connection fails.
NO_NETWORK = textwrap.dedent(
    """
    import socket

    def _refuse(*args, **kwargs):
        raise OSError("network access is disabled for this test")

    socket.socket.connect = _refuse
    socket.socket.connect_ex = _refuse
    socket.create_connection = _refuse
    socket.getaddrinfo = _refuse
    """
)

CHILD = textwrap.dedent(
    """
    import socket, sys
    from pathlib import Path
    try:
        socket.create_connection(("pypi.org", 443), timeout=2)
    except OSError as exc:
        assert "disabled for this test" in str(exc), exc
    else:
        raise SystemExit("the network is not cut")

    from omnilive.engine_settings import CascadeSettings
    from omnilive.engines.cascade import CascadeEngine
    from tests.cascade.speech import espeak

    engine = CascadeEngine(CascadeSettings(), Path(sys.argv[1]))
    engine.load(lambda stage, fraction: None)
    print("HEARD:" + engine.stack.asr.transcribe(espeak(sys.argv[2])).text)
    """
)


def test_loads_and_transcribes_with_the_network_cut(
    engine: CascadeEngine, data_dir: Path, tmp_path: Path
) -> None:
    # ``engine`` first: the Whisper join is already done in ``data_dir``.
    (tmp_path / "sitecustomize.py").write_text(NO_NETWORK)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    sentence = "Please describe the weather in London today."
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(data_dir), sentence],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    heard = done.stdout.split("HEARD:", 1)[1]
    assert overlap(sentence, heard) >= 0.8, heard
