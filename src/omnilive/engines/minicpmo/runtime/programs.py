"""What a program on the batch loop's thread yields (see
:mod:`~omnilive.engines.minicpmo.runtime.loop`), and the *picks* made of its
steps' results.

A program yields a :class:`Step` (new positions for its slot's LLM or speech
LM context) and is sent the step's :class:`StepResult`. A step may carry a
:class:`Pick`: a function made of the result before the program sees it,
typically the next token's choice. The loop runs every pick function of a
tick ONCE over all the steps that named it (:func:`run_picks`), so the
sessions decoding in step choose their tokens together: one pass over the
device for all of them and one read back, instead of one each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import torch

from omnilive.engines.minicpmo.runtime.batch import StepResult

T = TypeVar("T")

# ``fn(pairs)``: one value per (result, item) pair, in order.
PickFunction = Callable[[list[tuple[StepResult, Any]]], list[Any]]


@dataclass(frozen=True)
class Pick:
    """``fn`` over this step's result and ``item`` (with every other step of
    the tick that names the same ``fn``); its value reaches the program as
    :attr:`StepResult.picked`."""

    fn: PickFunction
    item: Any = None


@dataclass(frozen=True)
class Step:
    """What a program asks for next: ``inputs`` (token ids ``[n]`` or
    embeddings ``[n, hidden]``) appended to its slot's context of the LLM
    or, with ``speech``, of the speech LM; it is sent the :class:`StepResult`,
    with ``pick``'s value if it names one."""

    inputs: torch.Tensor
    speech: bool = False
    pick: Pick | None = None


# A decoding loop run on the worker thread: it yields steps, is sent their
# results and returns its outcome. Between its steps it may use the slot's
# caches directly: the worker owns them.
Program = Generator[Step, StepResult, T]


class Picking(Protocol):
    """One step's part in :func:`run_picks` (the batch loop's job of the
    step): its result is replaced by one carrying the value, or its error
    set (the pick failed)."""

    result: Any
    pick: Pick | None
    error: BaseException | None


def run_picks(steps: Sequence[Picking], timed: Callable[[str, float], None] | None = None) -> None:
    """Each pick function once, over every step that names it; a function
    that raises (or returns the wrong count) fails its steps alone.
    ``timed(kind, started)`` (if given) is told when each function started,
    as ``picks <its name>``."""
    by_fn: dict[PickFunction, list[tuple[Picking, Any]]] = {}
    for step in steps:
        assert step.pick is not None
        by_fn.setdefault(step.pick.fn, []).append((step, step.pick.item))
    for fn, picking in by_fn.items():
        group = [step for step, _ in picking]
        started = time.perf_counter()
        try:
            values = fn([(step.result, item) for step, item in picking])
            if len(values) != len(group):
                raise ValueError(f"a pick made {len(values)} values for {len(group)} steps")
        except Exception as exc:  # the programs' callers get it
            for step in group:
                step.error = exc
            continue
        for step, value in zip(group, values, strict=True):
            step.result = replace(step.result, picked=value)
        if timed is not None:
            timed(f"picks {getattr(fn, '__name__', 'call')}", started)
