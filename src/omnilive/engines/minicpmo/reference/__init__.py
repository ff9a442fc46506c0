"""The model's own code path, one session at a time (``minicpmo.slots = 1``,
and the oracle the equality harnesses hold the slot sessions to): the loaded
model (``host``), its step graphs, and the chat, half-duplex and duplex views
over its code."""
