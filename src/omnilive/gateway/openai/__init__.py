"""OpenAI's Realtime GA dialect at the gateway: its machine and connection."""
