"""Apps: the user-facing modes an operator can switch on and off.

The switches live in ``data_dir/state/apps.json`` so that they survive a
restart. Every app is enabled until an operator says otherwise; the file only
records what was changed, and unknown ids in it are ignored (an app removed in
a later version must not break start-up).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from omnilive.config import RequestType, our_name, reference_name
from omnilive.recording.files import write_json_atomic

log = logging.getLogger(__name__)

AppId = Literal["turnbased", "half_duplex", "audio_duplex", "omni", "realtime"]
STATE_FILE = Path("state") / "apps.json"


class App(BaseModel):
    """One mode as the pages show it (``GET /api/apps``): the reference's
    ``app_id``, ``name`` and ``route``, and our ``id``, ``name_zh``,
    ``description``, ``path`` and ``enabled``."""

    model_config = ConfigDict(frozen=True)

    id: AppId
    name: str
    name_zh: str
    description: str
    path: str
    enabled: bool = True

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use on a property
    @property
    def app_id(self) -> str:
        return reference_name(self.id)

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use on a property
    @property
    def route(self) -> str:
        return self.path


APPS: tuple[App, ...] = (
    App(
        id="turnbased",
        name="Turn-based chat",
        name_zh="轮流对话",
        description="Send text, images, audio or video; get a streamed answer with speech.",
        path="/turnbased",
    ),
    App(
        id="half_duplex",
        name="Half-duplex voice",
        name_zh="半双工语音",
        description="Hands-free voice turns: the server hears when you stop and answers.",
        path="/half_duplex",
    ),
    App(
        id="audio_duplex",
        name="Audio full duplex",
        name_zh="音频全双工",
        description="Talk naturally: every second the model decides to listen or speak.",
        path="/audio_duplex",
    ),
    App(
        id="omni",
        name="Omni full duplex",
        name_zh="全模态全双工",
        description="Full duplex with your camera: the model sees and hears as you talk.",
        path="/omni",
    ),
    App(
        id="realtime",
        name="Realtime API",
        name_zh="实时 API",
        description="The full-duplex core behind the Realtime event protocol.",
        path="/realtime",
    ),
)
APP_IDS: tuple[str, ...] = tuple(app.id for app in APPS)

# The queue's request types are finer than apps only for duplex, whose two
# task types are two apps; the Realtime API is its own app whatever its mode.
_APP_OF_REQUEST: dict[RequestType, AppId] = {
    "chat": "turnbased",
    "half_duplex": "half_duplex",
    "audio_duplex": "audio_duplex",
    "omni_duplex": "omni",
}


def app_of(request_type: RequestType) -> AppId:
    """The app a session of this request type belongs to."""
    return _APP_OF_REQUEST[request_type]


class AppSwitches:
    """Which apps are enabled, persisted under the data dir.

    Reads are plain dictionary lookups (safe on the event loop); :meth:`set`
    writes the file and is meant to run off the loop. A lock keeps two
    concurrent changes from writing their snapshots out of order.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / STATE_FILE
        self._enabled: dict[str, bool] = dict.fromkeys(APP_IDS, True)
        self._lock = threading.Lock()

    def load(self) -> AppSwitches:
        """Read the saved switches (blocking); a missing or broken file means all enabled."""
        try:
            saved = json.loads(self.path.read_bytes()).get("enabled", {})
        except FileNotFoundError:
            return self
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("ignoring unreadable %s: %s", self.path, exc)
            return self
        for app_id, enabled in saved.items() if isinstance(saved, dict) else ():
            if app_id in self._enabled and isinstance(enabled, bool):
                self._enabled[app_id] = enabled
        return self

    def is_enabled(self, app_id: str) -> bool:
        return self._enabled.get(app_id, False)

    def apps(self, only_enabled: bool = False) -> list[App]:
        listed = [app.model_copy(update={"enabled": self._enabled[app.id]}) for app in APPS]
        return [app for app in listed if app.enabled or not only_enabled]

    def get(self, app_id: str) -> App | None:
        """The app named by our id or the reference's (its pages use theirs)."""
        app_id = our_name(app_id)
        return next((app for app in self.apps() if app.id == app_id), None)

    def set(self, app_id: str, enabled: bool) -> App:
        """Switch one app and save (blocking); ``KeyError`` for an unknown id."""
        app_id = our_name(app_id)
        if app_id not in self._enabled:
            raise KeyError(app_id)
        with self._lock:
            self._enabled[app_id] = enabled
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, {"enabled": dict(self._enabled)})
        app = self.get(app_id)
        assert app is not None
        return app
