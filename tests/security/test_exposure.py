"""An open gateway (no API keys) binds loopback only, unless --insecure, loudly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx

from omnilive.cli import check_exposure
from omnilive.config import load_settings
from tests.security.conftest import USER_KEY
from tests.servers import Server


def _settings(**env: str):
    return load_settings(environ={"OMNILIVE_INTERNAL_TOKEN": "t", **env})


def test_open_gateway_must_stay_on_loopback(tmp_path: Path):
    assert check_exposure(_settings()) is None
    assert check_exposure(_settings(OMNILIVE_HOST="::1")) is None
    refusal = check_exposure(_settings(OMNILIVE_HOST="0.0.0.0"))
    assert refusal is not None and "--insecure" in refusal
    keyed = _settings(OMNILIVE_HOST="0.0.0.0", OMNILIVE_AUTH__KEYS=f'[{{"key": "{USER_KEY}"}}]')
    assert check_exposure(keyed) is None
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{USER_KEY} user\n")
    from_file = _settings(OMNILIVE_HOST="0.0.0.0", OMNILIVE_AUTH__KEYS_FILE=str(keys_file))
    assert check_exposure(from_file) is None
    keys_file.write_text(f"{USER_KEY} superuser\n")
    assert "bad API keys" in (check_exposure(from_file) or "")
    # the command refuses before it binds anything
    done = subprocess.run(
        [sys.executable, "-m", "omnilive", "gateway", "--host", "0.0.0.0", "--port", "1"],
        env={**os.environ, "OMNILIVE_INTERNAL_TOKEN": "t"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--insecure" in done.stderr


async def test_insecure_gateway_serves_and_says_so(tmp_path: Path):
    gateway = Server(
        tmp_path,
        command="gateway",
        workers=0,
        env={"OMNILIVE_INTERNAL_TOKEN": "t"},
        args=["--host", "0.0.0.0", "--insecure"],
    ).start()
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(100):
                try:
                    response = await client.get(f"{gateway.http}/health", timeout=2)
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)
            assert response.status_code == 200
        assert "INSECURE: no API keys, listening on 0.0.0.0" in gateway.full_log()
    finally:
        gateway.stop()
