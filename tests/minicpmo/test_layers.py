"""The GPU engine's package shows its layers: the batched runtime imports no
session logic and no model rule, nothing imports in a circle, and no module
keeps under the 500-line limit (tests/unit/test_house_rules.py, the whole
tree's) by switching the formatter off."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "src/omnilive/engines/minicpmo"
NAME = "omnilive.engines.minicpmo"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((NAME, *parts))] = path
    return found


def imports(path: Path, module: str) -> set[str]:
    """The package's modules ``path`` imports (at any depth, lazily too)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    known = modules()
    return {name for name in found if name in known and name != module}


def test_the_runtime_imports_nothing_above_it():
    runtime = f"{NAME}.runtime"
    wrong = {
        module: sorted(name for name in imports(path, module) if not name.startswith(runtime))
        for module, path in modules().items()
        if module.startswith(runtime)
    }
    assert {module: names for module, names in wrong.items() if names} == {}


@pytest.mark.parametrize(
    ("package", "sibling"),
    [("reference", "sessions"), ("sessions", "reference")],
    ids=["the model code path imports no session logic", "the slots import no oracle"],
)
def test_the_slot_sessions_and_the_oracle_are_siblings(package: str, sibling: str):
    # Both stand on host.py (the loaded checkpoint); only engine.py sees both.
    wrong = {
        module: sorted(
            name for name in imports(path, module) if name.startswith(f"{NAME}.{sibling}")
        )
        for module, path in modules().items()
        if module.startswith(f"{NAME}.{package}")
    }
    assert {module: names for module, names in wrong.items() if names} == {}


def test_no_import_circle():
    known = modules()
    graph = {module: imports(path, module) for module, path in known.items()}
    # A package's __init__ importing its children is not a circle of concepts.
    graph = {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for name in sorted(graph[module]):
            if state.get(name) == 1:
                circles.append([*trail[trail.index(name) :], name])
            elif name not in state:
                visit(name, [*trail, name])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_no_module_holds_its_size_down_with_fmt_skip():
    skipping = [module for module, path in modules().items() if "fmt: skip" in path.read_text()]
    assert skipping == []
