"""The MiniCPM-o 4.5 engine (NVIDIA GPU).

Nothing here imports torch or transformers at import time: :mod:`backend`
does, lazily, when the engine loads. ``pip install 'omnilive[cuda]'`` brings
them.
"""

from omnilive.engines.minicpmo.engine import MiniCPMoEngine

__all__ = ["MiniCPMoEngine"]
