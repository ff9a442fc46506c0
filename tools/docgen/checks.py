"""What a generated or hand-written page must say, as checks that name what is missing.

Kept apart from the renderers so that a page edited by hand, or a renderer
that forgets something, is caught by a check that does not trust the renderer.
"""

from __future__ import annotations

import re

from omnilive.protocol.common import ErrorCode
from omnilive.protocol.openai_live import ERROR_CODES as LIVE_ERROR_CODES
from omnilive.protocol.openai_realtime import ERROR_CODES
from omnilive.protocol.realtime import RealtimeErrorCode
from tools.docgen import cli_page, messages_page, settings_page
from tools.docgen.markdown import default_text


def _rows(text: str) -> dict[str, list[str]]:
    """Table rows by their first cell's code text: ``host`` -> the row's cells."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if match:
            rows.setdefault(match.group(1), [c.strip() for c in match.group(2).split(" | ")])
    return rows


def missing_settings(text: str) -> list[str]:
    """Settings the configuration page lacks, or shows without their environment
    variable, default or description."""
    rows = _rows(text)
    missing = []
    for setting in settings_page.leaf_settings():
        row = rows.get(setting.dotted)
        if row is None:
            missing.append(f"{setting.dotted}: no row")
            continue
        joined = " | ".join(row)
        default = default_text(setting.default).replace("|", "\\|")
        for what, needed in (("environment variable", setting.env), ("default", default)):
            if f"`{needed}`" not in joined:
                missing.append(f"{setting.dotted}: no {what} {needed}")
        if not setting.field.description or setting.field.description not in joined:
            missing.append(f"{setting.dotted}: no description")
    return missing


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every ``##``-or-deeper section."""
    parts = re.split(r"^(#{2,4} .*)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def missing_message_fields(text: str) -> list[str]:
    """Fields of the protocol models the client-message page does not list under
    their message, per protocol."""
    missing = []
    sections = _sections(text)
    for protocol in messages_page.PROTOCOLS:
        start = next((i for i, (h, _) in enumerate(sections) if h == f"## {protocol.title}"), None)
        if start is None:
            missing.append(f"{protocol.title}: no section")
            continue
        end = next(
            (i for i in range(start + 1, len(sections)) if sections[i][0].startswith("## ")),
            len(sections),
        )
        mine = sections[start + 1 : end]
        tops = messages_page.top_models(protocol)
        for model in [*tops, *messages_page.nested_models_of(tops)]:
            kind = messages_page.message_type(model) if model in tops else None
            title = f"`{kind}`" if kind else f"`{model.__name__}`"
            body = next((b for h, b in mine if h.split(" ", 1)[1].startswith(title)), None)
            if body is None:
                missing.append(f"{protocol.title}: no section for {title}")
                continue
            for name, field in model.model_fields.items():
                if f"| `{field.alias or name}` |" not in body:
                    missing.append(f"{protocol.title} {title}: no field {field.alias or name}")
    return missing


def unnamed_message_types(text: str) -> list[str]:
    """Client message types (``prepare``, ``session.update``, ...) that the hand-written
    API pages never name in code."""
    missing = []
    for protocol in messages_page.PROTOCOLS:
        for model in messages_page.top_models(protocol):
            kind = messages_page.message_type(model)
            if kind and not re.search(rf"`{re.escape(kind)}[`{{]", text):
                missing.append(f"{protocol.title}: {kind}")
    return missing


def missing_options(text: str) -> list[str]:
    """Command-line options of every ``omnilive`` command the CLI page lacks, and
    options that have no help to show there."""
    missing = []
    sections = dict(_sections(text))
    for name, sub in cli_page.subcommands(cli_page.clean_parser()).items():
        body = sections.get(f"## `omnilive {name}`")
        if body is None:
            missing.append(f"omnilive {name}: no section")
            continue
        for action in cli_page.options(sub):
            flags = ", ".join(action.option_strings) or action.dest
            if f"| `{flags}` |" not in body:
                missing.append(f"omnilive {name}: {flags}")
            elif not action.help:
                missing.append(f"omnilive {name}: {flags} has no help")
    return missing


# Every error code the server sends, and the reference page that must explain it.
ERROR_PAGES: dict[str, tuple[str, ...]] = {
    "reference/errors.md": tuple(code.value for code in ErrorCode),
    "reference/websocket.md": tuple(code.value for code in RealtimeErrorCode),
    "reference/openai-realtime.md": tuple(sorted(ERROR_CODES)),
    "reference/openai-live.md": tuple(sorted(LIVE_ERROR_CODES)),
}


def unexplained_error_codes(page: str, text: str) -> list[str]:
    """Codes of ``page``'s protocols that ``text`` never names (`code` or {code})."""
    return [
        code for code in ERROR_PAGES[page] if not re.search(rf"[`{{]{re.escape(code)}[`}}]", text)
    ]


_UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _same_default(written: str, value: object) -> bool:
    """Whether a default as the hand-written page gives it (``8006``, ``64 MiB``,
    ``cascade``, ``[]``) is the model's ``value``."""
    if isinstance(value, bool):
        return written == ("true" if value else "false")
    if isinstance(value, int | float):
        number, _, unit = written.partition(" ")
        try:
            return float(number) * _UNITS.get(unit, 1) == float(value)
        except ValueError:
            return False
    if isinstance(value, list | tuple):
        return written == "[]" and not value
    return written == str(value)


def stale_topic_defaults(text: str) -> list[str]:
    """Rows of the settings-by-topic page whose defaults, each in code, disagree
    with the settings model (rows whose defaults are prose are not checked)."""
    defaults = {row.dotted: row.default for row in settings_page.leaf_settings()}
    stale = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([a-z_.]+)`", cells[0])
        written = [part.strip() for part in cells[1].split(", ")]
        if len(names) != len(written) or not all(re.fullmatch(r"`[^`]*`", w) for w in written):
            continue
        for name, shown in zip(names, written, strict=True):
            if name in defaults and not _same_default(shown.strip("`"), defaults[name]):
                stale.append(f"{name}: the page says {shown}, the model {defaults[name]!r}")
    return stale
