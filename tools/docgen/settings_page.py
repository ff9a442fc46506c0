"""docs/reference/configuration.md from ``omnilive.config.Settings``: every field."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from omnilive.config import ENV_PREFIX, Settings
from tools.docgen.markdown import code, default_text, models_in, page_head, table, type_name


@dataclass(frozen=True)
class SettingRow:
    """One leaf setting: its dotted name, and what the page says of it."""

    path: tuple[str, ...]
    field: FieldInfo

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + "__".join(self.path).upper()

    @property
    def default(self) -> Any:
        return self.field.get_default(call_default_factory=True, validated_data={})


def _is_section(field: FieldInfo) -> bool:
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def sections(
    model: type[BaseModel] = Settings, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], type[BaseModel], list[SettingRow]]]:
    """The settings model as (section path, section model, its leaf settings), depth first."""
    rows = [
        SettingRow((*path, name), field)
        for name, field in model.model_fields.items()
        if not _is_section(field)
    ]
    found = [(path, model, rows)]
    for name, field in model.model_fields.items():
        if _is_section(field):
            found += sections(field.annotation, (*path, name))
    return found


def leaf_settings() -> list[SettingRow]:
    return [row for _, _, rows in sections() for row in rows]


def _item_models(rows: list[SettingRow]) -> list[type[BaseModel]]:
    """Models inside a setting's type (``auth.keys`` is a list of ``ApiKey``)."""
    found: list[type[BaseModel]] = []
    for row in rows:
        found += [m for m in models_in(row.field.annotation) if m not in found]
    return found


def _doc(model: type[BaseModel]) -> str:
    return inspect.cleandoc(model.__doc__ or "").strip()


def render() -> str:
    out = [
        page_head(
            "Configuration",
            "src/omnilive/config.py",
            "One typed settings object (`src/omnilive/config.py`), loaded once at start-up. "
            "Sources in rising precedence: the defaults, a TOML file (`--config`), `OMNILIVE_*` "
            "environment variables, command-line flags. Nested sections are TOML tables and "
            "double-underscore variables: `[eta] chat_s = 20` or `OMNILIVE_ETA__CHAT_S=20`. "
            "Lists in the environment are JSON (`worker_urls`, `auth.allowed_origins` and "
            "`presets.dirs` also take a comma- or path-separated list). "
            "[Settings by topic](../operating/settings.md) explains them by what they are for.",
        )
    ]
    header = ["setting", "type", "default", "environment variable", "description"]
    for path, model, rows in sections():
        if not rows:
            continue
        title = "Top level" if not path else f"`[{'.'.join(path)}]`"
        out.append(f"\n## {title}\n\n")
        if path and _doc(model):
            out.append(_doc(model) + "\n\n")
        out.append(
            table(
                header,
                [
                    [
                        code(row.dotted),
                        code(type_name(row.field.annotation)),
                        code(default_text(row.default)),
                        code(row.env),
                        row.field.description or "",
                    ]
                    for row in rows
                ],
            )
        )
        for item in _item_models(rows):
            out.append(f"\nEach item of type `{item.__name__}`: {_doc(item)}\n\n")
            out.append(
                table(
                    ["field", "type", "default", "description"],
                    [
                        [
                            code(name),
                            code(type_name(f.annotation)),
                            "required"
                            if f.is_required()
                            else code(default_text(f.get_default(call_default_factory=True))),
                            f.description or "",
                        ]
                        for name, f in item.model_fields.items()
                    ],
                )
            )
    return "".join(out)
