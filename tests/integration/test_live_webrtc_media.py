"""OpenAI's Live API over WebRTC with the calls run by media processes
(``webrtc.media_processes``): the calls of ``test_live_webrtc.py`` (the SDK's
create, talk, delegation and hang-up; a refused ``session.start`` told on
the data channel after the answer; the key's credentials and session limit)
again, each session a loopback WebSocket from its media process."""

from __future__ import annotations

import pytest

from tests.integration import test_live_webrtc as live
from tests.webrtc_peer import MEDIA_ENV

pytestmark = [
    pytest.mark.shared_server(env={"OMNILIVE_TRANSCRIPTION__WHISPER": "true", **MEDIA_ENV}),
    pytest.mark.usefixtures("media_processes"),
]

test_the_sdk_s_call_talks_delegates_and_hangs_up = (
    live.test_the_sdk_s_call_talks_delegates_and_hangs_up
)
test_a_refused_start_is_an_error_on_the_channel_and_the_call_goes_on = (
    live.test_a_refused_start_is_an_error_on_the_channel_and_the_call_goes_on
)
test_a_live_call_takes_the_websocket_path_credentials_and_limits = (
    live.test_a_live_call_takes_the_websocket_path_credentials_and_limits
)
