"""The gateway: one asyncio process in front of the workers, without torch."""
