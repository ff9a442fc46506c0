from __future__ import annotations

# Fixtures, found by pytest through these names.
from tests.live_fixtures import _close_clients, _module_server, server  # noqa: F401
from tests.webrtc_peer import media_processes  # noqa: F401
