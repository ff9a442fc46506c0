"""Session recordings: the recorder the runners feed, replays, the read side
the gateway serves, recovery after a crash, and cleanup."""
