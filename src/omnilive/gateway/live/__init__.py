"""OpenAI's Live dialect (full duplex, delegation) at the gateway: its machine
and connection."""
