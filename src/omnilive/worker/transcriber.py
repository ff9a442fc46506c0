"""A Whisper beside the engine, for engines that do not transcribe what the
user said (MiniCPM-o hears speech as audio): the packaged Whisper base
(CTranslate2), on the CPU or a GPU, loaded on first use and shared by the
worker's sessions."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from omnilive.config import Settings
from omnilive.engine_settings import TranscriptionSettings

if TYPE_CHECKING:  # the cascade's packages: imported when it first loads
    from omnilive.engines.cascade.asr import WhisperASR

log = logging.getLogger(__name__)


class SideTranscriber:
    def __init__(self, settings: TranscriptionSettings, data_dir: Path) -> None:
        self._settings = settings
        self._data_dir = data_dir
        self._asr: WhisperASR | None = None  # once loaded
        self._loading = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> SideTranscriber | None:
        return (
            cls(settings.transcription, settings.data_dir)
            if settings.transcription.whisper
            else None
        )

    def _loaded(self) -> WhisperASR:
        with self._loading:
            if self._asr is None:
                # The cascade's packages (faster-whisper, the packaged model) bring it.
                from omnilive.engines.cascade.asr import WhisperASR
                from omnilive.engines.cascade.models import prepare_whisper

                model_dir = prepare_whisper(self._data_dir / "cache", lambda *_: None)
                asr = WhisperASR(model_dir, self._settings.threads, self._settings.device)
                asr.load()
                log.info("side Whisper loaded on %s", self._settings.device)
                self._asr = asr
            return self._asr

    def transcribe_now(self, speech: np.ndarray) -> str:
        return self._loaded().transcribe(speech).text

    async def transcribe(self, speech: np.ndarray) -> str:
        """The text of 16 kHz speech, off the event loop."""
        return await asyncio.to_thread(self.transcribe_now, speech)
