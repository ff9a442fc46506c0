"""The fake model code's stream decoder (``fake_model.py``): a KV cache of
labelled entries and the model code's sliding window over it."""

from __future__ import annotations

from dataclasses import dataclass


class FakeCache:
    """A KV cache: one entry per token fed."""

    def __init__(self) -> None:
        self.entries: list[str] = []

    def add(self, label: str, n: int) -> None:
        self.entries.extend([label] * n)

    def get_seq_length(self) -> int:
        return len(self.entries)

    def crop(self, length: int) -> None:
        del self.entries[length:]


@dataclass
class FakeWindowConfig:
    """The model code's ``DuplexWindowConfig``, by its field names."""

    sliding_window_mode: str = "off"
    basic_window_high_tokens: int = 8000
    basic_window_low_tokens: int = 6000
    context_previous_max_tokens: int = 500
    context_max_units: int = 24


class FakeDecoder:
    """The duplex object's stream decoder: its own KV cache, and its sliding
    window as the model code's does it: a unit is what it fed from
    ``<unit>`` to ``</unit>``; past the window, the oldest units' entries go
    (the system prompt's never), and in ``context`` mode what a dropped unit
    said stays as a bounded "previous" note after the system prompt."""

    def __init__(self) -> None:
        self.cache: FakeCache | None = None
        self._window_config = FakeWindowConfig()
        self._window_enabled = True
        self.reset()

    def feed(self, label: str, n: int) -> None:
        if self.cache is None:
            self.cache = FakeCache()
        self.cache.add(label, n)

    def get_cache_length(self) -> int:
        return self.cache.get_seq_length() if self.cache else 0

    def reset(self) -> None:
        self.cache = None
        self.units: list[tuple[int, int]] = []  # (length, words spoken)
        self.unit_start = 0
        self._total_dropped_units = 0

    def set_window_config(self, config: FakeWindowConfig) -> None:
        self._window_config = config

    def set_window_enabled(self, enabled: bool) -> None:
        self._window_enabled = enabled

    def unit_started(self) -> None:
        self.unit_start = self.get_cache_length()

    def unit_ended(self, spoken: int) -> None:
        self.units.append((self.get_cache_length() - self.unit_start, spoken))
        config = self._window_config
        if not self._window_enabled or self.cache is None:
            return
        if config.sliding_window_mode == "basic":
            if self.get_cache_length() <= config.basic_window_high_tokens:
                return
            while self.get_cache_length() > config.basic_window_low_tokens and self.units:
                self._drop_oldest()
        elif config.sliding_window_mode == "context":
            while len(self.units) > config.context_max_units:
                self._drop_oldest(note=config.context_previous_max_tokens)

    def _drop_oldest(self, note: int | None = None) -> None:
        assert self.cache is not None
        length, spoken = self.units.pop(0)
        entries = self.cache.entries
        kept = [e for e in entries if e in ("system", "voice")]
        previous = sum(e == "previous" for e in entries)
        units = entries[len(kept) + previous + length :]
        if note is not None:
            previous = min(previous + spoken, note)
        self.cache.entries = kept + ["previous"] * previous + units
        self._total_dropped_units += 1
