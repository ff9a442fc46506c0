"""A page loaded over HTTPS from a name that is not localhost, as on a LAN:
it is a secure context, so it gets the microphone, and it opens its session
socket as ``wss://``; the recording viewer works the same way. Loaded over
plain HTTP from the same name, a page gets no microphone at all, which is
why HTTPS is needed off localhost.

Chromium resolves ``omnilive.test`` to 127.0.0.1 and accepts exactly the test
certificate's key (``--ignore-certificate-errors-spki-list``): any other
certificate would still fail. Off loopback a gateway needs API keys, TLS or
not, so this one has a key, which the page holds as a signed-in user would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.browser.harness import chromium, run_async, screenshot, watch
from tests.servers import Server
from tests.tls_servers import TlsServer, issue, spki_hash, trust

NAME = "omnilive.test"
USER_KEY = "ol-https-user-key-0123456789"
ADMIN_KEY = "ol-https-admin-key-0123456789"
RESULTS = "window.omniliveDuplex.results"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A test CA's certificate for NAME: (CA file, certificate, key)."""
    folder = tmp_path_factory.mktemp("https-cert")
    ca = trustme.CA()
    cafile = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    certfile, keyfile = issue(ca, folder, NAME, "127.0.0.1")
    return cafile, certfile, keyfile


@pytest.fixture(scope="module")
def https_server(
    tmp_path_factory: pytest.TempPathFactory, certificate: tuple[Path, Path, Path]
) -> Iterator[TlsServer]:
    cafile, certfile, keyfile = certificate
    tmp = tmp_path_factory.mktemp("browser-https")
    args = ["--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)]
    keys = [{"key": USER_KEY, "role": "user"}, {"key": ADMIN_KEY, "role": "admin"}]
    env = {"OMNILIVE_AUTH__KEYS": json.dumps(keys)}
    with pytest.MonkeyPatch.context() as patch:
        trust(patch, cafile)
        server = TlsServer(tmp, args=args, env=env, api_key=ADMIN_KEY).start()
        try:
            run_async(server.wait_ready(timeout=60, workers=1))
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def browser(
    tmp_path_factory: pytest.TempPathFactory, certificate: tuple[Path, Path, Path]
) -> Iterator:
    _, certfile, _ = certificate
    extra = [
        f"--host-resolver-rules=MAP {NAME} 127.0.0.1",
        f"--ignore-certificate-errors-spki-list={spki_hash(certfile)}",
    ]
    with chromium(tmp_path_factory.mktemp("https"), extra) as context:
        yield context


def _origin(server: Server, scheme: str = "https") -> str:
    """The server's address under NAME, which only the browser resolves."""
    return f"{scheme}://{NAME}:{server.port}"


def _signed_in_page(browser):
    """A page holding the user key, as after the sign-in prompt."""
    page = browser.new_page()
    page.add_init_script(f"sessionStorage.setItem('omnilive.apiKey', {json.dumps(USER_KEY)})")
    return page


def test_https_page_gets_the_microphone_and_opens_wss(browser, https_server: TlsServer) -> None:
    page = _signed_in_page(browser)
    problems = watch(page)
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    try:
        page.goto(f"{_origin(https_server)}/audio_duplex?transport=websocket")
        page.wait_for_selector("body[data-ready]", state="attached")
        assert page.evaluate("window.isSecureContext") is True
        page.click("#start")
        page.wait_for_selector("#subtitle.visible", timeout=20_000)
        wss = f"wss://{NAME}:{https_server.port}/ws/duplex/"
        assert sockets and all(url.startswith(wss) for url in sockets), sockets
        # The engine heard Chromium's fake microphone (its beeps) through that socket.
        page.wait_for_function(
            f"{RESULTS}.some(r => /rms 0\\.(?!000)\\d{{3}}/.test(r.text || ''))", timeout=20_000
        )
        assert page.evaluate("window.omniliveAudio.chunks") > 0  # and its answer played
        screenshot(page, "https-audio_duplex")
        page.click("#stop")
        link = page.locator("#transcript a[href^='/s/']")
        link.wait_for()
        viewer_path = link.get_attribute("href")
        assert problems.items == []
    finally:
        page.close()

    viewer = _signed_in_page(browser)
    problems = watch(viewer)
    try:
        viewer.goto(f"{_origin(https_server)}{viewer_path}")
        viewer.wait_for_selector("#timeline .entry.unit")
        viewer.wait_for_load_state("networkidle")
        assert viewer.url.startswith("https://")
        assert problems.items == []
    finally:
        viewer.close()


def test_the_same_name_over_http_gets_no_microphone(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    try:
        page.goto(f"{_origin(scripted_server, 'http')}/audio_duplex?transport=websocket")
        assert page.evaluate("window.isSecureContext") is False
        assert page.evaluate("typeof navigator.mediaDevices") == "undefined"
    finally:
        page.close()
