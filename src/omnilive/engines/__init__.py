"""Engines, and the registry that builds one from the settings by name
(:mod:`omnilive.engines.registry`).

Importing this package imports no engine: each is imported when it is built.
"""

from omnilive.engines.registry import ENGINE_NAMES, ENGINES, create_engine

__all__ = ["ENGINES", "ENGINE_NAMES", "create_engine"]
