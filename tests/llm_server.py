"""A real OpenAI-compatible language model server for the tests that need
one: llama-cpp-python's own server over the packaged SmolLM2, with its
``chatml-function-calling`` format, so that tool calls are real."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from omnilive.engines.cascade.models import llm_gguf_path
from tests.servers import free_port


def serve_llm(folder: Path) -> Iterator[str]:
    """The server's base URL (``…/v1``) until the generator is closed."""
    port = free_port()
    log = open(folder / "llm.log", "wb")  # noqa: SIM115 - closed below
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(llm_gguf_path()),
        "--chat_format", "chatml-function-calling", "--port", str(port),
        "--n_threads", "1", "--n_ctx", "2048",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("llama_cpp.server did not start")
        yield url
    finally:
        process.terminate()
        process.wait(10)
        log.close()
