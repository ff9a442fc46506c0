"""No module of the package is over 500 lines: a module that grows past it
holds two concepts (the GPU engine's package may not keep under it with
``# fmt: skip`` either: tests/minicpmo/test_layers.py)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "src/omnilive"
MAX_LINES = 500


def test_no_module_is_over_500_lines():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {module: n for module, n in sizes.items() if n > MAX_LINES} == {}
