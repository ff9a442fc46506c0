"""One runner per mode: it drives an engine session for one client."""
