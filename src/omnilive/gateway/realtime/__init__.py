"""The reference's two Realtime dialects at the gateway (``/v1/realtime``):
their sans-I/O machines, the connection that drives them, and the turn-based
chat of the newer dialect. OpenAI's and Live's wings build on its actions
(``machine.py``) and its connection (``connection.py``)."""
