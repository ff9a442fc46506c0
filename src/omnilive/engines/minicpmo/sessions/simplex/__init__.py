"""Chat and half-duplex answers in slots: the session, its rules, its
speech, its history and window, the prompts encoded together and the
engine's views."""
