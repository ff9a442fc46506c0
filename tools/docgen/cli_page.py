"""docs/reference/cli.md from ``omnilive.cli.build_parser()``: every command and option."""

from __future__ import annotations

import argparse
import os
from unittest import mock

from omnilive.cli import build_parser
from tools.docgen.markdown import code, page_head, table


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``omnilive``'s commands, in the order the parser declares them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return " | ".join(str(c) for c in action.choices)
    name = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    return f"[{name}]" if action.nargs == "?" else str(name)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return code(action.default)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)


def clean_parser() -> argparse.ArgumentParser:
    """The parser as it is without ``OMNILIVE_*`` variables (``talk`` takes its
    defaults from them), so the page does not depend on who generates it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMNILIVE_")}
    with mock.patch.dict(os.environ, environ, clear=True):
        return build_parser()


def render() -> str:
    parser = clean_parser()
    out = [
        page_head(
            "Command line",
            "src/omnilive/cli.py",
            "`omnilive COMMAND [options]`. Options given on the command line win over the "
            "environment and the `--config` file ([Configuration](configuration.md)); "
            "exit codes are on [Start-up failures](../operating/startup.md).",
        )
    ]
    helps = _help_of(parser)
    for name, sub in subcommands(parser).items():
        out.append(f"\n## `omnilive {name}`\n\n{helps.get(name, '')}\n\n")
        rows = [
            [
                code(", ".join(a.option_strings) or a.dest),
                code(_value(a)) if _value(a) else "",
                _default(a),
                _help(sub, a),
            ]
            for a in options(sub)
        ]
        out.append(table(["option", "value", "default", "what it does"], rows))
    return "".join(out)
