"""Gateways for the security tests: in process with API keys, or real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from omnilive.config import Settings, load_settings
from omnilive.gateway.app import create_app

# Fixtures, found by pytest through these names: a real, keyless gateway.
from tests.live_fixtures import _close_clients, _module_server, server  # noqa: F401

USER_KEY = "user-key-0123456789abcdef"
ADMIN_KEY = "admin-key-0123456789abcdef"
EXPIRED_KEY = "expired-key-0123456789abcdef"
WRONG_KEY = "wrong-key-0123456789abcdef"
KEYS = [
    {"key": USER_KEY, "role": "user", "name": "alice", "requests_per_minute": 0},
    {"key": ADMIN_KEY, "role": "admin", "name": "ops", "requests_per_minute": 0},
    {"key": EXPIRED_KEY, "role": "admin", "name": "old", "expires_at": 1_000_000.0},
]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def keyed_settings(tmp: Path, **env: str) -> Settings:
    return load_settings(
        environ={
            "OMNILIVE_INTERNAL_TOKEN": "internal",
            "OMNILIVE_DATA_DIR": str(tmp / "data"),
            "OMNILIVE_AUTH__KEYS": json.dumps(KEYS),
            **env,
        }
    )


@pytest.fixture(scope="module")
def keyed_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FastAPI, TestClient]]:
    """A gateway with a user, an admin and an expired key, and no workers."""
    app = create_app(keyed_settings(tmp_path_factory.mktemp("keyed")))
    with TestClient(app, base_url="http://127.0.0.1:8006") as client:
        yield app, client
