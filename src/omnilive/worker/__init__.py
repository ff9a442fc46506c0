"""A worker process: one engine, its session runners, an internal API."""
