"""The one error every sans-I/O machine raises when its driver reports
something the machine's state cannot follow.

It is a bug in the driver (a route, a runner, a session link), never a
client's mistake: a client's bad input becomes a typed refusal in its own
dialect (``protocol/common.py``'s ``ProtocolError``), not this.
"""

from __future__ import annotations


class IllegalTransition(Exception):
    """A machine was told something its state cannot follow (a bug in its driver)."""
