"""OpenAI's Realtime GA dialect on the worker: the OpenAI Realtime runner
(turns over the half-duplex view: ``runner.py``, ``responses.py``,
``machine.py``), its full-duplex runner over the unit loop
(``duplex_runner.py``), their presenters and the conversation's items."""
