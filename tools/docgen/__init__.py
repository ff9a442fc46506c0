"""The documentation pages made from the code, so they cannot drift from it.

Each page is a pure function of the tree: the settings model, the argument
parser, the protocol models, the saved benchmark results. ``python -m
tools.docgen`` writes them; ``--check`` (and ``tests/docs``) fails on a page
that is not what the code makes today.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tools.docgen import cli_page, messages_page, results_page, settings_page

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Page (relative to docs/) -> the function that makes its text.
PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": settings_page.render,
    "reference/cli.md": cli_page.render,
    "reference/messages.md": messages_page.render,
    "benchmarks/results.md": lambda: results_page.render(ROOT / "benchmarks" / "results"),
}


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The generated pages whose committed text differs from what the code makes now."""
    stale = []
    for name, render in PAGES.items():
        path = docs / name
        if not path.exists() or path.read_text(encoding="utf-8") != render():
            stale.append(name)
    return stale


def write_pages(docs: Path = DOCS) -> list[str]:
    """Write every generated page; the names of those that changed."""
    changed = []
    for name, render in PAGES.items():
        path = docs / name
        text = render()
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed
