"""The engines a worker can load, by name: the one list the settings, the
command line and :func:`create_engine` read.

Each entry names a class as ``"module:Class"`` (and the GPUs a worker of it
asks a Ray cluster for); the module is imported only
when that engine is built, so that the scripted engine needs none of the
model packages and the cascade none of the GPU ones (nor does reading the
settings import any engine). A new engine is its package, whose engine class
has ``from_settings(settings)``, and one line here.

Nothing here imports the settings or the engines at run time: ``config.py``
takes the names from this module while it is itself being imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from omnilive.config import Settings
    from omnilive.engines.base import Engine


@dataclass(frozen=True)
class EngineEntry:
    """One engine: its class as ``"module:Class"``, and the GPUs a worker of it
    asks a Ray cluster for unless ``ray.worker_gpus`` says otherwise."""

    target: str
    gpus: float = 0.0


# The order is the order the settings' error and the reference pages list them in.
ENGINES: dict[str, EngineEntry] = {
    "cascade": EngineEntry("omnilive.engines.cascade:CascadeEngine"),
    "scripted": EngineEntry("omnilive.engines.scripted:ScriptedEngine"),
    "minicpmo": EngineEntry("omnilive.engines.minicpmo:MiniCPMoEngine", gpus=1.0),
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)


class EngineClass(Protocol):
    """What an entry names: an engine class that builds itself from the settings."""

    def from_settings(self, settings: Settings) -> Engine:
        """The engine, built (not loaded) from its section of ``settings``."""
        ...


def engine_entry(name: str) -> EngineEntry:
    """The entry registered as ``name``; an unknown name is a ValueError naming the known."""
    entry = ENGINES.get(name)
    if entry is None:
        known = ", ".join(ENGINE_NAMES)
        raise ValueError(f"unknown engine {name!r} (known engines: {known})")
    return entry


def engine_class(name: str) -> EngineClass:
    """The class registered as ``name``, its module imported now."""
    module, _, attribute = engine_entry(name).target.partition(":")
    found: EngineClass = getattr(importlib.import_module(module), attribute)
    return found


def create_engine(settings: Settings) -> Engine:
    """Build (but do not load) the engine named in ``settings.engine``."""
    return engine_class(settings.engine).from_settings(settings)
