"""What the gateway offers besides sessions: app switches, presets and stored
voices. Built once in the lifespan (or by a test) and kept in ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import Request, WebSocket

from omnilive.apps import AppSwitches
from omnilive.config import Settings
from omnilive.presets.catalog import PresetCatalog
from omnilive.voices.speech import SpeechCache
from omnilive.voices.store import VoiceStore

SPEECH_CACHE_DIR = Path("cache") / "presets"


@dataclass
class Catalogs:
    """The gateway's catalogues; see :func:`catalogs_of`."""

    apps: AppSwitches
    presets: PresetCatalog
    voices: VoiceStore
    speech: SpeechCache

    @classmethod
    def open(cls, settings: Settings) -> Catalogs:
        """Read the saved app switches (blocking: call it off the event loop)."""
        data_dir = Path(settings.data_dir)
        return cls(
            apps=AppSwitches(data_dir).load(),
            presets=PresetCatalog(settings.presets.dirs),
            voices=VoiceStore(data_dir),
            speech=SpeechCache(data_dir / SPEECH_CACHE_DIR),
        )


def catalogs_of(connection: Request | WebSocket) -> Catalogs:
    catalogs: Catalogs = connection.app.state.catalogs
    return catalogs
