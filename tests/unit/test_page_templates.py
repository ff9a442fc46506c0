"""How the pages are put together (gateway/routes/pages.py): placeholders,
block indentation, and the per-mode parts of the one duplex fragment."""

from __future__ import annotations

import dataclasses
import re

import pytest

from omnilive.gateway.routes import pages


def test_fill_replaces_inline_and_indents_blocks() -> None:
    template = '<main class="{{cls}}">\n  {{body}}\n  {{none}}\n</main>\n'
    filled = pages._fill(template, {"cls": "page", "body": "<p>\n  x\n</p>\n", "none": ""})
    # A block keeps the placeholder line's indentation; an empty one drops the line.
    assert filled == '<main class="page">\n  <p>\n    x\n  </p>\n</main>\n'


def test_fill_leaves_unknown_names_and_does_not_refill_values() -> None:
    filled = pages._fill("{{a}} {{session_id}}", {"a": "{{a}}{{b}}", "b": "B"})
    assert filled == "{{a}}{{b}} {{session_id}}"


def test_an_unfilled_placeholder_fails_at_render() -> None:
    page = pages.PAGES["/omni"]
    broken = dataclasses.replace(page, slots={**page.slots, "stage": "{{stge}}\n"})
    with pytest.raises(ValueError, match="stge"):
        pages.render(broken)


def test_only_the_viewer_keeps_a_placeholder_for_later() -> None:
    for page in pages.PAGES.values():
        assert "{{" not in pages.render(page), page.name
    viewer = pages.render(pages.VIEWER)
    assert set(re.findall(r"\{\{(\w+)\}\}", viewer)) == {"session_id"}
    assert '<meta name="session-id" content="{{session_id}}">' in viewer
    assert "<title>omnilive session</title>" in viewer


def test_every_page_has_the_shell_once() -> None:
    for page in [*pages.PAGES.values(), pages.VIEWER]:
        document = pages.render(page)
        assert document.startswith("<!doctype html>\n"), page.name
        assert document.count("<main ") == document.count('id="notice"') == 1, page.name
        assert f'<script type="module" src="/static/js/pages/{page.script}.js">' in document
        assert f'<meta name="page-title" content="{page.title}">' in document
        ids = re.findall(r'\sid="([^"]+)"', document)
        assert len(ids) == len(set(ids)), page.name


def test_duplex_pages_differ_only_in_their_mode_parts() -> None:
    audio = pages.render(pages.PAGES["/audio_duplex"])
    omni = pages.render(pages.PAGES["/omni"])
    for document, mode, about in ((audio, "audio_duplex", "audio"), (omni, "omni", "omni")):
        assert f'<h1 data-i18n="mode.{mode}"></h1>' in document
        assert f'<p class="hint" data-i18n="duplex.about_{about}"></p>' in document
    assert 'class="stage audio-stage"' in audio and 'id="preview"' not in audio
    assert 'class="stage video-stage"' in omni and 'id="preview"' in omni
    assert 'id="hd"' in omni and 'id="hd"' not in audio
    for shared in ("start", "stop", "pause", "force-listen", "metrics", "transcript", "volume"):
        assert f'id="{shared}"' in audio and f'id="{shared}"' in omni
