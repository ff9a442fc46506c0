"""Cleanup: by age, then by total size (oldest first); live sessions kept,
abandoned "active" ones not; ``--dry-run`` deletes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from omnilive.cli import main
from omnilive.clock import iso
from omnilive.config import Settings
from omnilive.recording.cleanup import (
    DAY_S,
    Policy,
    SessionInfo,
    cleanup,
    cleanup_periodically,
    plan,
)

NOW = time.time()
KB = 1024


def make_session(
    data_dir: Path,
    recording_id: str,
    age_days: float,
    size_kb: int,
    status: str = "ended",
    idle_s: float | None = None,
) -> Path:
    """A session created ``age_days`` ago, last written ``idle_s`` ago."""
    directory = data_dir / "sessions" / recording_id
    (directory / "user_audio").mkdir(parents=True)
    created = NOW - age_days * DAY_S
    meta = {"session_id": recording_id, "status": status, "created_at": iso(created)}
    (directory / "meta.json").write_text(json.dumps(meta))
    (directory / "recording.json").write_text("{}")
    (directory / "user_audio" / "000.wav").write_bytes(bytes(size_kb * KB))
    written = NOW - (age_days * DAY_S if idle_s is None else idle_s)
    for path in (directory / "meta.json", directory / "recording.json", directory):
        os.utime(path, (written, written))
    return directory


def ids(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "sessions").iterdir()}


def info(name: str, age_days: float, size: int, status: str = "ended", idle_s: float = 0):
    created = NOW - age_days * DAY_S
    return SessionInfo(name, Path(name), created, NOW - idle_s, size, status)


def test_plan_deletes_by_age_then_oldest_first_by_size():
    sessions = [
        info("new", 1, 300),
        info("old", 40, 100),
        info("mid", 10, 300),
        info("older", 20, 300),
    ]
    policy = Policy(retention_days=30, max_bytes=700)
    assert [(s.recording_id, why) for s, why in plan(sessions, policy, NOW)] == [
        ("old", "age"),
        ("older", "size"),
    ]
    roomy = Policy(retention_days=30, max_bytes=10_000)
    assert [s.recording_id for s, _ in plan(sessions, roomy, NOW)] == ["old"]


def test_plan_never_takes_a_live_session_but_takes_abandoned_ones():
    sessions = [
        info("live-old", 40, 500, "active", idle_s=5),  # a long session, still writing
        info("live-big", 1, 5000, "active", idle_s=5),
        info("abandoned", 40, 10, "active", idle_s=40 * DAY_S),  # crashed, never closed
        info("stale-recent", 2, 10, "active", idle_s=7 * 3600),
    ]
    policy = Policy(retention_days=30, max_bytes=100)
    doomed = [(s.recording_id, why) for s, why in plan(sessions, policy, NOW)]
    assert doomed == [("abandoned", "age"), ("stale-recent", "size")]


def test_cleanup_on_disk_and_dry_run(tmp_path: Path):
    data = tmp_path / "data"
    make_session(data, "chat_old", 45, 4)
    make_session(data, "hd_crashed", 45, 4, status="active")  # abandoned long ago
    make_session(data, "odx_live", 45, 4, status="active", idle_s=2)  # still being written
    make_session(data, "chat_a", 3, 40)
    make_session(data, "chat_b", 2, 40)
    make_session(data, "chat_c", 1, 40)
    make_session(data, "hd_stale", 1, 1, status="active", idle_s=7 * 3600)  # crashed today
    (data / "sessions" / "not a session").mkdir()  # foreign names are left alone
    (data / "sessions" / ".trash-chat_x-abc").mkdir()  # a killed cleanup's leftover
    policy = Policy(retention_days=30, max_bytes=100 * KB)
    everything = ids(data)

    dry = cleanup(data, policy, dry_run=True, now=NOW)
    assert ids(data) == everything, "a dry run deletes nothing"
    assert dry.scanned == 7 and dry.kept_live == ["odx_live"] and dry.closed_stale == ["hd_stale"]
    expected = [("chat_old", "age"), ("hd_crashed", "age"), ("chat_a", "size")]
    assert [(i, why) for i, why, _ in dry.deleted] == expected

    done = cleanup(data, policy, now=NOW)
    assert [(i, why) for i, why, _ in done.deleted] == expected
    assert done.closed_stale == ["hd_stale"]
    stale = json.loads((data / "sessions" / "hd_stale" / "meta.json").read_text())
    assert stale["status"] == "abnormal" and stale["ended_at"]
    assert done.freed_bytes >= 48 * KB
    assert ids(data) == {"odx_live", "chat_b", "chat_c", "hd_stale", "not a session"}


def test_cleanup_of_a_missing_data_dir_is_a_no_op(tmp_path: Path):
    report = cleanup(tmp_path / "nothing", Policy(30, 1), now=NOW)
    assert report.scanned == 0 and report.deleted == []


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch):
    for name in list(os.environ):
        if name.startswith("OMNILIVE_"):
            monkeypatch.delenv(name)
    data = tmp_path / "data"
    make_session(data, "chat_old", 10, 1)
    make_session(data, "chat_new", 1, 1)
    args = ["cleanup", "--data-dir", str(data), "--retention-days", "5", "--max-gb", "1"]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would delete chat_old (age" in out and ids(data) == {"chat_old", "chat_new"}
    assert main(args) == 0
    assert "deleted chat_old" in capsys.readouterr().out and ids(data) == {"chat_new"}
    # the size cap, from the flag: 1 KB of 1 GB → the older goes first
    make_session(data, "chat_newer", 0.5, 1)
    assert main(["cleanup", "--data-dir", str(data), "--max-gb", str(1.5 / 1024**2)]) == 0
    assert ids(data) == {"chat_newer"}


async def until_no_sessions(data: Path) -> None:
    for _ in range(250):
        if not ids(data):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"still there: {ids(data)}")


async def test_the_gateway_task_cleans_at_start_and_then_periodically(tmp_path: Path):
    data = tmp_path / "data"
    make_session(data, "chat_old", 40, 1)
    settings = Settings(data_dir=data)
    settings.recording.cleanup_interval_s = 0.05
    task = asyncio.create_task(cleanup_periodically(settings))
    try:
        await until_no_sessions(data)
        make_session(data, "chat_older", 50, 1)  # found on a later round
        await until_no_sessions(data)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
