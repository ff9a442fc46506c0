"""The embedded default engine: Whisper base + SmolLM2-135M + espeak-ng on the CPU."""

from omnilive.engines.cascade.engine import CascadeEngine

__all__ = ["CascadeEngine"]
