"""Rules the whole tree keeps (STYLE.md), checked on every module of the
package, the tests, the benchmarks and the tools:

- no module is over 500 lines: one that grows past it holds two concepts (the
  GPU engine's package may not keep under it with ``# fmt: skip`` either:
  tests/minicpmo/test_layers.py);
- tasks are owned and named: no ``asyncio.ensure_future`` anywhere, and every
  ``create_task`` outside the tests names its task, so a stuck or failed one
  shows in a dump of the running tasks and in the logs;
- one definition of a shared idea: one ``IllegalTransition`` for every
  machine, one ``ProtocolError`` (a refused client message: code, message)
  for every protocol and dialect.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
TREES = ("src/omnilive", "tests", "benchmarks", "tools")
MAX_LINES = 500


# Folders inside the trees that hold what a run installs or writes (npm's
# packages carry Python of their own), never the project's code.
NOT_OURS = {"node_modules", "artifacts", "__pycache__"}


def modules(*trees: str) -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for tree in trees
        for path in sorted((ROOT / tree).rglob("*.py"))
        if not NOT_OURS & set(path.relative_to(ROOT).parts)
    }


def test_no_module_is_over_500_lines():
    sizes = {module: len(text.splitlines()) for module, text in modules(*TREES).items()}
    assert {module: n for module, n in sizes.items() if n > MAX_LINES} == {}


def calls_of(text: str, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == name
    ]


def test_no_task_is_made_by_ensure_future():
    found = {
        f"{module}:{call.lineno}"
        for module, text in modules(*TREES).items()
        for call in calls_of(text, "ensure_future")
    }
    assert found == set()


def test_every_task_outside_the_tests_has_a_name():
    unnamed = {
        f"{module}:{call.lineno}"
        for module, text in modules("src/omnilive", "benchmarks", "tools").items()
        for call in calls_of(text, "create_task")
        if not any(keyword.arg == "name" for keyword in call.keywords)
    }
    assert unnamed == set()


def modules_defining(name: str) -> set[str]:
    """The package's modules that define a class called ``name``."""
    return {
        module
        for module, text in modules("src/omnilive").items()
        if any(
            isinstance(node, ast.ClassDef) and node.name == name
            for node in ast.walk(ast.parse(text))
        )
    }


def test_one_illegal_transition_for_every_machine():
    # Every sans-I/O machine raises the same error for a driver's bug, so a
    # test or a caller catches one type whichever machine it drives.
    assert modules_defining("IllegalTransition") == {"src/omnilive/transitions.py"}


def test_one_protocol_error_for_every_dialect():
    # A refused client message is one type whatever the dialect; each
    # dialect's presenter (refusal_event) makes its own error event of it.
    assert modules_defining("ProtocolError") == {"src/omnilive/protocol/common.py"}


def test_names_that_collided_mean_one_thing():
    # Each of these once named two different things in different rooms.
    assert modules_defining("WorkerLink") == {"src/omnilive/gateway/links.py"}
    assert modules_defining("Call") == {"src/omnilive/gateway/webrtc/call.py"}
    assert modules_defining("Step") == {"src/omnilive/engines/minicpmo/runtime/programs.py"}
