"""The MiniCPM-o 4.5 engine (NVIDIA GPU).

Nothing here imports torch or transformers at import time: :mod:`backend`
does, lazily, when the engine loads. ``pip install 'omnilive[cuda]'`` brings
them; the vocoder's ``minicpmo-utils`` goes in beside them with ``--no-deps``
(its declared dependencies pin a media stack it never uses; docs/operating/gpus.md).
"""

from omnilive.engines.minicpmo.engine import MiniCPMoEngine

__all__ = ["MiniCPMoEngine"]
