"""The documentation site builds with ``mkdocs build --strict``, and strictness bites."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tools.docgen import ROOT


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


def copy_project(to: Path) -> Path:
    """mkdocs.yml, docs/ and what docs/ links to outside itself (the changelog)."""
    project = to / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project)
    shutil.copy(ROOT / "CHANGELOG.md", project)
    shutil.copytree(ROOT / "docs", project / "docs", symlinks=True)
    return project


def test_site_builds_strictly(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    site = tmp_path / "site"
    pages = {page.relative_to(site).as_posix() for page in site.rglob("*.html")}
    assert {"index.html", "reference/configuration.html", "modes/duplex.html"} <= pages
    diagram = (tmp_path / "site" / "modes" / "duplex.html").read_text()
    assert '<pre class="mermaid">' in diagram  # drawn by the browser, not fetched at build


def test_broken_link_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    with open(project / "docs" / "development.md", "a") as page:
        page.write("\n[gone](reference/no-such-page.md) and [anchor](index.md#no-such-anchor)\n")
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr
    assert "no-such-anchor" in result.stderr


def test_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    (project / "docs" / "orphan.md").write_text("# Orphan\n")
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    assert "orphan.md" in result.stderr
