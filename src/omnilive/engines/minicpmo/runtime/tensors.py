"""Tensor helpers of the runtime: a session's state copied or swapped in
and out of shared modules."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def clone_tensors(value: Any) -> Any:
    """A deep copy of the tensors in nested dicts, lists and tuples (a vocoder
    cache): the session's own, untouched by another session's steps."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: clone_tensors(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(clone_tensors(item) for item in value)
    return value


@contextlib.contextmanager
def swapped(target: Any, values: dict[str, Any]) -> Any:
    """Set ``target``'s attributes to ``values`` for the block, then take the
    (possibly replaced) values back into ``values`` and restore ``target``'s."""
    saved = {name: getattr(target, name, None) for name in values}
    for name, value in values.items():
        setattr(target, name, value)
    try:
        yield values
    finally:
        for name in values:
            values[name] = getattr(target, name, None)
            setattr(target, name, saved[name])
