"""The live pages over WebRTC in Chromium (fake microphone and camera):
half-duplex sessions against the scripted and cascade engines and an omni
duplex session against the scripted one, whose audio goes up and comes back
on Opus tracks and whose events travel on the data channel; stopping ends
the call on the server; and a browser whose ICE cannot find a path falls back
to the WebSocket and says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.harness import (
    chromium,
    run_async,
    screenshot,
    settle_transport,
    spoken_wav,
    watch,
    watched_page,
)
from tests.servers import Server

# A browser with no network path for WebRTC: relay candidates only, and no
# TURN server to relay through, so ICE has nothing to pair with the server's.
NO_PATH = """(() => {
    const Original = window.RTCPeerConnection;
    window.RTCPeerConnection = function (config = {}) {
        return new Original({...config, iceServers: [], iceTransportPolicy: 'relay'});
    };
    window.RTCPeerConnection.prototype = Original.prototype;
})()"""
# Every peer connection a page makes, for its statistics.
KEEP_PEERS = """(() => {
    const Original = window.RTCPeerConnection;
    window.peers = [];
    window.RTCPeerConnection = function (...args) {
        const pc = new Original(...args);
        window.peers.push(pc);
        return pc;
    };
    window.RTCPeerConnection.prototype = Original.prototype;
})()"""
STATS = """async () => {
    const pc = window.peers[window.peers.length - 1];
    const out = {up: 0, down: 0, energy: 0, video: 0, video_frames: 0, channel_in: 0};
    (await pc.getStats()).forEach((r) => {
        if (r.type === 'outbound-rtp' && r.kind === 'audio') out.up = r.bytesSent;
        if (r.type === 'outbound-rtp' && r.kind === 'video') {
            out.video = r.bytesSent;
            out.video_frames = r.framesEncoded;
        }
        if (r.type === 'inbound-rtp' && r.kind === 'audio') {
            out.down = r.bytesReceived;
            out.energy = r.totalAudioEnergy || 0;
        }
        if (r.type === 'data-channel') out.channel_in = r.messagesReceived;
    });
    return out;
}"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    tmp = tmp_path_factory.mktemp("webrtc")
    # The fake microphone plays the file in a loop, and over WebRTC the page
    # lets the user speak over an answer: with a short silence, the question
    # asked again interrupted slow answers before one was done (a loaded run).
    question = spoken_wav(tmp / "question.wav", "What is the capital of France?", silence_s=30.0)
    with chromium(tmp, [f"--use-file-for-fake-audio-capture={question}"]) as context:
        context.add_init_script(KEEP_PEERS)
        yield context


def calls_open(server: Server) -> int:
    return run_async(server.get("/api/webrtc/config"))["open"]


def wait_no_calls(page, server: Server) -> None:
    for _ in range(50):
        if calls_open(server) == 0:
            return
        page.wait_for_timeout(200)
    raise AssertionError("the call is still open on the server")


def start(page, server: Server, path: str, transport: str = "webrtc", hd: bool = False) -> None:
    """Open ``path``, press Start (``hd``: in the omni page's HD), and wait
    until the page talks over ``transport``."""
    page.goto(server.http + path)
    page.wait_for_selector("body[data-ready]", state="attached")
    if hd:
        page.check("#hd")
    page.click("#start")
    settle_transport(page, server, transport)


@pytest.mark.parametrize("engine", ["scripted", pytest.param("cascade", marks=pytest.mark.cascade)])
def test_half_duplex_over_webrtc(browser, engine: str, request: pytest.FixtureRequest) -> None:
    server: Server = request.getfixturevalue(f"{engine}_server")
    page = browser.new_page()
    problems = watch(page)
    try:
        start(page, server, "/half_duplex")
        assert calls_open(server) == 1
        # The server's VAD heard the question on the Opus track, and the answer came.
        page.wait_for_selector("#transcript .turn.ai[data-done]", timeout=60_000)
        assert page.inner_text("#transcript .turn.user").strip()
        page.wait_for_function(f"({STATS})().then((s) => s.energy > 0)", timeout=15_000)
        stats = page.evaluate(STATS)
        assert stats["up"] > 0 and stats["down"] > 0 and stats["channel_in"] > 0, stats
        assert not page.is_visible("#notice.error")
        screenshot(page, "half-duplex-webrtc")
        page.click("#stop")
        page.locator("#transcript a[href^='/s/']").wait_for()
        assert page.is_visible("#start")
        wait_no_calls(page, server)
        assert problems.items == []
    finally:
        page.close()


@pytest.mark.parametrize(("hd", "frame_size"), [(False, "640x360"), (True, "1280x720")])
def test_omni_over_webrtc(browser, scripted_server: Server, hd: bool, frame_size: str) -> None:
    with watched_page(browser) as (page, problems):
        start(page, scripted_server, "/omni", hd=hd)
        page.wait_for_selector("#subtitle.visible", timeout=25_000)
        # The engine counts the frames it saw, with the last one's size: the
        # camera track was sampled at the size the session asked for (the
        # fake camera is 1280x720; HD is two slices, with frames twice as wide).
        assert f"frames 1 {frame_size}" in page.inner_text("#subtitle")
        page.wait_for_function(f"({STATS})().then((s) => s.energy > 0)", timeout=15_000)
        stats = page.evaluate(STATS)
        assert stats["video"] > 0 and stats["down"] > 0, stats
        # The camera goes at 5 frames a second, not its own 30: the model sees one a second.
        page.wait_for_timeout(2000)
        frames = page.evaluate(STATS)["video_frames"] - stats["video_frames"]
        assert 2 <= frames <= 14, frames
        assert page.evaluate("window.omniliveAudio.chunks") == 0  # no audio in the events
        page.click("#stop")
        page.locator("#transcript a[href^='/s/']").wait_for()
        wait_no_calls(page, scripted_server)
        assert problems.items == []


# The browser says the call's connection failed (as it does when the network
# goes), while the connection itself still stands: the page must offer again
# with the session's token, and the server must give the session to the new call.
FAIL_CALL = """() => {
    const pc = window.omniliveRtc.pc;
    Object.defineProperty(pc, 'connectionState', {get: () => 'failed'});
    pc.onconnectionstatechange();
}"""


def test_a_failed_call_is_resumed_on_a_new_one(browser, scripted_server: Server) -> None:
    with watched_page(browser) as (page, problems):
        start(page, scripted_server, "/audio_duplex")
        page.wait_for_function("window.omniliveDuplex.results.length >= 2", timeout=20_000)
        first = page.evaluate("window.peers.length")
        page.evaluate(FAIL_CALL)
        page.wait_for_function("window.omniliveRtc.resumes === 1", timeout=15_000)
        assert page.evaluate("window.peers.length") == first + 1
        assert "Reconnected" in page.inner_text("body")
        before = page.evaluate("window.omniliveDuplex.results.length")
        # The same session goes on, heard and answered over the new call only.
        page.wait_for_function(
            f"window.omniliveDuplex.results.length >= {before + 2}", timeout=20_000
        )
        assert calls_open(scripted_server) == 1
        assert page.is_visible("#stop")
        page.click("#stop")
        page.locator("#transcript a[href^='/s/']").wait_for()
        wait_no_calls(page, scripted_server)
        assert problems.items == []


def test_failed_ice_falls_back_to_the_websocket(browser, scripted_server: Server) -> None:
    page = browser.new_page()
    page.add_init_script(NO_PATH)
    try:
        start(page, scripted_server, "/audio_duplex", "websocket")
        assert "WebSocket" in page.inner_text("#notice")
        page.wait_for_function("window.omniliveDuplex.results.length >= 2", timeout=20_000)
        wait_no_calls(page, scripted_server)  # the failed call was hung up
        page.click("#stop")
    finally:
        page.close()
