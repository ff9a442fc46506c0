"""Queue wait estimates: per request type, a configured baseline until enough
durations have been seen, then an exponential moving average of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnilive.config import REQUEST_TYPES, EtaSettings, RequestType


@dataclass
class _Ema:
    value: float = 0.0
    samples: int = 0


class EtaModel:
    """Baselines, the EMA state, and the remaining time of a running session."""

    def __init__(self, settings: EtaSettings) -> None:
        self.settings = settings.model_copy()
        self._ema = {t: _Ema() for t in REQUEST_TYPES}

    def baseline(self, request_type: RequestType) -> float:
        ema = self._ema[request_type]
        if ema.samples >= self.settings.ema_min_samples:
            return ema.value
        return self.settings.baseline(request_type)

    def observe(self, request_type: RequestType, duration_s: float) -> None:
        ema = self._ema[request_type]
        alpha = self.settings.ema_alpha
        ema.value = duration_s if ema.samples == 0 else alpha * duration_s + (1 - alpha) * ema.value
        ema.samples += 1

    def remaining(self, request_type: RequestType, elapsed_s: float) -> float:
        """Time a running session still needs; past its baseline it is assumed
        to need the overrun floor, never zero, so queued clients are not told
        "any moment now" forever."""
        left = self.baseline(request_type) - elapsed_s
        return left if left > 0 else self.settings.overrun_floor_s

    def update(self, changes: dict[str, Any]) -> None:
        """Change only the named settings (``PUT /api/config/eta``)."""
        merged = self.settings.model_dump() | changes
        self.settings = EtaSettings.model_validate(merged)

    def to_dict(self) -> dict[str, Any]:
        """``GET /api/config/eta``: the reference's ``config`` and flat
        ``ema_<type>_s`` / ``ema_<type>_samples``, and our settings by their
        own names with the baselines in effect."""
        settings = self.settings.model_dump()
        reference: dict[str, Any] = {
            "config": {
                **{f"eta_{t}_s": settings[f"{t}_s"] for t in REQUEST_TYPES},
                "ema_alpha": self.settings.ema_alpha,
            }
        }
        for t, ema in self._ema.items():
            reference[f"ema_{t}_s"] = round(ema.value, 3) if ema.samples else None
            reference[f"ema_{t}_samples"] = ema.samples
        return {
            **settings,
            **reference,
            "effective_baselines_s": {t: round(self.baseline(t), 3) for t in REQUEST_TYPES},
            "ema_state": {
                t: {"value_s": round(e.value, 3), "samples": e.samples}
                for t, e in self._ema.items()
            },
        }
