"""omnilive: live conversation with omni-modal models."""

__version__ = "0.1.0"
