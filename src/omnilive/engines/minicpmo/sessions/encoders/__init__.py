"""The input encoders the slots share: a unit's inputs (units.py), the
vision encoder, streaming Whisper batched across sessions and its graphs."""
