"""The vocoder the slots share: voice streams, the flow and HiFT, batched
across the sessions that wait."""
