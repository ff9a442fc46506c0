"""The model's own code path, one session at a time: the oracle the equality
harnesses and the contract tests hold the slot sessions to
(``MiniCPMoEngine(..., oracle=True)``; no setting serves it), and the simplex
seat's fallback for a speech LM the slots do not own. Its step graphs, and
the chat, half-duplex and duplex views over the loaded model (``host.py``)."""
