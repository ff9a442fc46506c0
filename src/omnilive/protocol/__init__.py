"""Typed wire messages, one module per API. Pydantic at the edges."""
