"""The session protocols' rules on the worker, without I/O (driven by ``runners/``)."""
