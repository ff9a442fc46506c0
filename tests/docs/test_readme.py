"""The README: short, the two commands first, and every link it makes resolves."""

from __future__ import annotations

import re

from tools.docgen import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_under_200_lines() -> None:
    assert len(README.splitlines()) <= 200


def test_readme_starts_with_serve_and_test() -> None:
    block = README.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split("#")[0].strip() for line in block] == ["make serve", "make test"]


def test_readme_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local, "the README links into the documentation"
    assert [link for link in local if not (ROOT / link).exists()] == []
