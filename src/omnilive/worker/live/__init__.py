"""OpenAI's Live dialect on the worker: its runner over the duplex unit loop
and its presenter (the delegation beside it is ``worker/delegation/``)."""
