"""Keep recordings bounded: delete those older than ``retention_days``, then
the oldest until the total is under ``max_storage_gb``.

A session that is live (``status: active`` and written to recently) is never
deleted. One that says ``active`` but has not been written to for
``stale_after_s`` was abandoned (its process died without anyone closing it)
and is treated like any ended session, so a crash cannot pin disk forever;
if kept, it is marked ``abnormal``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from omnilive.config import Settings, load_settings
from omnilive.ids import is_safe_id
from omnilive.recording.files import META, RECORDING, read_json, sessions_root
from omnilive.recording.recovery import recover_abandoned

log = logging.getLogger(__name__)

GB = 1024**3
DAY_S = 86_400.0
# Longer than any live session goes without a write: duplex writes every
# second, half-duplex every turn (inactivity ends it within 15 min), a chat
# request is capped at an hour.
STALE_AFTER_S = 6 * 3600.0
TRASH_PREFIX = ".trash-"


@dataclass(frozen=True)
class Policy:
    retention_days: float
    max_bytes: int
    stale_after_s: float = STALE_AFTER_S

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        recording = settings.recording
        return cls(recording.retention_days, int(recording.max_storage_gb * GB))


@dataclass(frozen=True)
class SessionInfo:
    recording_id: str
    path: Path
    created: float  # epoch seconds
    modified: float  # newest write to its meta.json / recording.json
    size: int
    status: str

    def live(self, policy: Policy, now: float) -> bool:
        return self.status == "active" and now - self.modified < policy.stale_after_s


@dataclass
class Report:
    scanned: int = 0
    total_bytes: int = 0
    deleted: list[tuple[str, str, int]] = field(default_factory=list)  # (id, reason, bytes)
    kept_live: list[str] = field(default_factory=list)
    closed_stale: list[str] = field(default_factory=list)  # abandoned, now marked abnormal
    dry_run: bool = False

    @property
    def freed_bytes(self) -> int:
        return sum(size for _, _, size in self.deleted)


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                info = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _created(meta: dict[str, object], fallback: float) -> float:
    """``created_at`` of the meta; the directory's time when it is unreadable."""
    value = meta.get("created_at")
    if not isinstance(value, str):
        return fallback
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return fallback


def describe(path: Path) -> SessionInfo:
    meta = read_json(path / META) or {}
    modified = max(_mtime(path), _mtime(path / META), _mtime(path / RECORDING))
    created = _created(meta, modified)
    return SessionInfo(
        path.name, path, created, modified, _size(path), str(meta.get("status", "unknown"))
    )


def scan(data_dir: Path) -> list[SessionInfo]:
    root = sessions_root(data_dir)
    if not root.is_dir():
        return []
    return [
        describe(entry)
        for entry in sorted(root.iterdir())
        if is_safe_id(entry.name) and entry.is_dir() and not entry.is_symlink()
    ]


def plan(sessions: list[SessionInfo], policy: Policy, now: float) -> list[tuple[SessionInfo, str]]:
    """Which sessions to delete and why: pure, so it is tested without disks."""
    doomed: list[tuple[SessionInfo, str]] = []
    kept: list[SessionInfo] = []
    for info in sorted(sessions, key=lambda s: s.created):
        if not info.live(policy, now) and now - info.created > policy.retention_days * DAY_S:
            doomed.append((info, "age"))
        else:
            kept.append(info)
    total = sum(s.size for s in kept)
    for info in kept:  # oldest first
        if total <= policy.max_bytes:
            break
        if not info.live(policy, now):
            doomed.append((info, "size"))
            total -= info.size
    return doomed


def _delete(path: Path) -> None:
    """Rename first (atomic), so readers never see a half-deleted session."""
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{secrets.token_hex(3)}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def cleanup(
    data_dir: Path, policy: Policy, dry_run: bool = False, now: float | None = None
) -> Report:
    """Apply ``policy`` to ``data_dir/sessions``. Blocking."""
    now = time.time() if now is None else now
    root = sessions_root(data_dir)
    if not dry_run and root.is_dir():
        for leftover in root.glob(f"{TRASH_PREFIX}*"):  # from a cleanup that was killed
            shutil.rmtree(leftover, ignore_errors=True)
    sessions = scan(data_dir)
    report = Report(
        scanned=len(sessions), total_bytes=sum(s.size for s in sessions), dry_run=dry_run
    )
    report.kept_live = [s.recording_id for s in sessions if s.live(policy, now)]
    for info, reason in plan(sessions, policy, now):
        if not dry_run:
            try:
                _delete(info.path)
            except FileNotFoundError:
                continue
        report.deleted.append((info.recording_id, reason, info.size))
    deleted = {recording_id for recording_id, _, _ in report.deleted}
    for info in sessions:
        # Kept but abandoned: say so, as the gateway does when it sees a worker die.
        stale = info.status == "active" and not info.live(policy, now)
        if stale and info.recording_id not in deleted:
            if not dry_run:
                recover_abandoned(data_dir, info.recording_id)
            report.closed_stale.append(info.recording_id)
    return report


async def cleanup_periodically(settings: Settings) -> None:
    """The gateway's background task: once at start, then every interval."""
    policy = Policy.from_settings(settings)
    while True:
        try:
            report = await asyncio.to_thread(cleanup, settings.data_dir, policy)
        except OSError:
            log.exception("recording cleanup failed")
        else:
            if report.deleted:
                log.info(
                    "recording cleanup: deleted %d sessions, freed %.1f MB",
                    len(report.deleted),
                    report.freed_bytes / 2**20,
                )
        await asyncio.sleep(settings.recording.cleanup_interval_s)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--data-dir", type=Path, help="the data directory of the recordings")
    parser.add_argument("--retention-days", type=float, help="delete recordings older than this")
    parser.add_argument("--max-gb", type=float, help="largest total size of the recordings")
    parser.add_argument("--dry-run", action="store_true", help="list, delete nothing")


def run_cli(args: argparse.Namespace, environ: dict[str, str]) -> int:
    """``omnilive cleanup``: flags over environment over settings file."""
    settings = load_settings(
        args.config,
        environ,
        {
            "data_dir": args.data_dir,
            "recording.retention_days": args.retention_days,
            "recording.max_storage_gb": args.max_gb,
        },
    )
    report = cleanup(settings.data_dir, Policy.from_settings(settings), dry_run=args.dry_run)
    verb = "would delete" if report.dry_run else "deleted"
    for recording_id, reason, size in report.deleted:
        print(f"{verb} {recording_id} ({reason}, {size / 2**20:.1f} MB)")
    print(
        f"{report.scanned} sessions, {report.total_bytes / 2**20:.1f} MB; {verb} "
        f"{len(report.deleted)} ({report.freed_bytes / 2**20:.1f} MB); "
        f"{len(report.kept_live)} live kept; {len(report.closed_stale)} abandoned closed"
    )
    return 0
