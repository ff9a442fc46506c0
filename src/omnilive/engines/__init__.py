"""Engines and the selector that builds one from the settings.

Engine modules are imported lazily so that the scripted engine needs none of
the model packages, and the cascade none of the GPU ones.
"""

from __future__ import annotations

from omnilive.config import Settings
from omnilive.engines.base import Engine


def create_engine(settings: Settings) -> Engine:
    """Build (but do not load) the engine named in ``settings.engine``."""
    if settings.engine == "scripted":
        from omnilive.engines.scripted import ScriptedEngine

        return ScriptedEngine(settings.scripted, settings.data_dir)
    if settings.engine == "cascade":
        from omnilive.engines.cascade import CascadeEngine

        return CascadeEngine(settings.cascade, settings.data_dir, settings.end_of_turn)
    if settings.engine == "minicpmo":
        from omnilive.engines.minicpmo import MiniCPMoEngine

        return MiniCPMoEngine(settings.minicpmo)
    raise ValueError(f"unknown engine {settings.engine!r}")
