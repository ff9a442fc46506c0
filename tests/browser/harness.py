"""Headless Debian Chromium driven by Playwright, against real servers.

Playwright's own browser downloads are never used (this machine cannot reach
them): the system's ``/usr/bin/chromium`` is launched with a fresh profile,
and fake media devices stand in for the microphone and camera. A test module
owns one browser, because the fake devices are fixed when it starts.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

from omnilive.audio import wav_bytes

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page, Request

    from tests.servers import Server

T = TypeVar("T")
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
BASE_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    # Pages start audio from clicks; this keeps a slow click from counting as no gesture.
    "--autoplay-policy=no-user-gesture-required",
]


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to the end from a sync test. Playwright's sync API keeps
    an event loop of its own in this thread, so the coroutine gets a thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def need_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail("the browser tests need /usr/bin/chromium (make test installs it)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("the browser tests need playwright (pip install -e '.[test]')")


def spoken_wav(path: Path, text: str, silence_s: float = 4.0) -> Path:
    """``text`` spoken by espeak-ng, then ``silence_s`` of silence, as a 16 kHz
    WAV for Chromium's fake microphone (which plays it in a loop)."""
    from tests.speech import silence, speak

    if shutil.which("espeak-ng") is None:
        pytest.fail("the browser tests need espeak-ng")
    audio = np.concatenate([silence(1.0), speak(text), silence(silence_s)])
    path.write_bytes(wav_bytes(audio, 16000))
    return path


@dataclass
class Problems:
    """Console errors, page errors and failed requests seen by a page."""

    items: list[str] = field(default_factory=list)
    allowed: tuple[str, ...] = ()

    def add(self, text: str) -> None:
        if not any(fragment in text for fragment in self.allowed):
            self.items.append(text)


def _benign(request: Request) -> bool:
    """Media elements abort their own range requests once they have what they
    need (metadata, a buffered stretch): that is not a failure."""
    return request.resource_type == "media" and request.failure == "net::ERR_ABORTED"


def watch(page: Page, allowed: tuple[str, ...] = ()) -> Problems:
    problems = Problems(allowed=allowed)
    page.on("console", lambda m: m.type == "error" and problems.add(f"console error: {m.text}"))
    page.on("pageerror", lambda e: problems.add(f"page error: {e}"))
    page.on("requestfailed", lambda r: _benign(r) or problems.add(f"failed: {r.url} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and problems.add(f"HTTP {r.status}: {r.url}"))
    return problems


@contextmanager
def watched_page(context: BrowserContext) -> Iterator[tuple[Page, Problems]]:
    """A new page of ``context`` and the problems it meets, closed at the end."""
    page = context.new_page()
    try:
        yield page, watch(page)
    finally:
        page.close()


@contextmanager
def chromium(tmp: Path, extra_args: list[str] | None = None) -> Iterator[BrowserContext]:
    """A persistent Chromium context with a fresh profile under ``tmp``."""
    from playwright.sync_api import sync_playwright

    need_chromium()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp / "profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*BASE_ARGS, *(extra_args or [])],
            viewport=DESKTOP,
            permissions=["microphone", "camera"],
        )
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            context.close()


def settle_transport(page: Page, server: Server, transport: str = "webrtc") -> None:
    """Wait until a live page, started, talks over a transport; fail saying
    why if it is not ``transport`` or none (the page's notice, its WebRTC
    steps with their times, the server's log)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        # The page gives WebRTC 2 s to gather and 8 s to connect after the answer.
        page.wait_for_selector("body[data-transport]", state="attached", timeout=40_000)
        used = page.evaluate("document.body.dataset.transport")
    except PlaywrightTimeout:
        used = None
    if used == transport:
        return
    notice = page.inner_text("#notice") if page.is_visible("#notice") else ""
    steps = page.evaluate("window.omniliveRtc ? window.omniliveRtc.steps : null")
    raise AssertionError(
        f"the page talks over {used or 'nothing after 40 s'}, not {transport}: "
        f"notice {notice!r}, WebRTC steps {steps}; the server's log ends:\n{server.log()[-2000:]}"
    )


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page screenshot as a test artifact (tests/artifacts/, not in git)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def start_session(page: Page, url: str) -> None:
    """Open a mode's page at ``url`` and press its start button once the page is ready."""
    page.goto(url)
    page.wait_for_selector("body[data-ready]", state="attached")
    page.click("#start")
