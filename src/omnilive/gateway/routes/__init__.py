"""HTTP and WebSocket routes of the gateway, one module per area."""
