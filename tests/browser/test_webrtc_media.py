"""The pages' WebRTC calls through Chromium, run by media processes
(``webrtc.media_processes``): the omni page's camera and the pages' resume
of a failed call, as in ``test_webrtc.py``, on a scripted server of this
module's own whose calls each live in a media process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser import test_webrtc as pages
from tests.browser.conftest import SHARED_RESUME_GRACE_S, _serve
from tests.servers import Server
from tests.webrtc_peer import MEDIA_ENV

browser = pages.browser  # its Chromium, with a fake camera and microphone
test_omni_over_webrtc = pages.test_omni_over_webrtc
test_a_failed_call_is_resumed_on_a_new_one = pages.test_a_failed_call_is_resumed_on_a_new_one


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """This module's server in place of the shared one, its calls in media processes."""
    env = {"OMNILIVE_LIMITS__RESUME_GRACE_S": str(SHARED_RESUME_GRACE_S), **MEDIA_ENV}
    yield from _serve(tmp_path_factory, "scripted", name="media", env=env)
