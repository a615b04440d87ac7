"""The config file's JSON Schema and the settings tables of ``plugins show`` and the docs.

Both are generated from the pydantic models, so descriptions and constraints have one home.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model

from hookrun.config.model import Config
from hookrun.hooks.discovery import installed_plugins
from hookrun.hooks.plugin import Priority, parse_priority


def schema() -> dict[str, Any]:
    """JSON Schema of the config file with every installed plugin's settings (plugins that
    fail to import are left out)."""
    fields: dict[str, Any] = {}
    for name, info in installed_plugins().items():
        try:
            cls = info.entry_point.load()
            settings_cls = cls.Settings
        except Exception:  # a broken third-party package must not break the schema
            continue
        section = create_model(
            f"{settings_cls.__name__}Section",
            __base__=settings_cls,
            priority=(  # type: ignore[arg-type]  # a Literal built at run time
                int | Literal[tuple(p.name for p in Priority)] | None,
                Field(
                    None,
                    description="Override the plugin's priority: 0-100 or a name "
                    f"(default {parse_priority(cls.priority, name)}); lower runs first.",
                ),
            ),
        )
        doc = (cls.__doc__ or "").strip().splitlines()
        fields[name] = (
            section | bool | None,
            Field(None, description=doc[0] if doc else f"The {name} plugin."),
        )
    plugins_model = create_model("Plugins", __config__=ConfigDict(extra="forbid"), **fields)
    full = create_model(
        "HookrunConfig",
        __base__=Config,
        plugins=(
            plugins_model,
            Field(
                default_factory=plugins_model,
                description=Config.model_fields["plugins"].description,
            ),
        ),
    )
    result = full.model_json_schema()
    result["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    result["title"] = "hookrun config"
    return result


def settings_rows(settings_cls: type[BaseModel]) -> list[dict[str, str]]:
    """One row per setting: name, type, default, constraints, description (for ``plugins
    show`` and the generated tables in the docs)."""
    schema = settings_cls.model_json_schema()
    defs = schema.get("$defs", {})
    rows = []
    for name, prop in schema.get("properties", {}).items():
        prop = _deref(prop, defs)
        field = settings_cls.model_fields[name]
        rows.append(
            {
                "name": name,
                "type": _type_text(prop, defs),
                "default": "required"
                if field.is_required()
                else _yaml_text(field.get_default(call_default_factory=True)),
                "constraints": _constraints(prop, defs),
                "description": field.description or "",
            }
        )
    return rows


def _deref(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if ref:
        merged = dict(defs[ref.rsplit("/", 1)[-1]])
        merged.update({k: v for k, v in prop.items() if k != "$ref"})
        return merged
    return prop


def _type_text(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    prop = _deref(prop, defs)
    options = prop.get("anyOf") or prop.get("oneOf")
    if options:
        return " | ".join(dict.fromkeys(_type_text(p, defs) for p in options))
    if "const" in prop:
        return _yaml_text(prop["const"])
    if "enum" in prop:
        return " | ".join(_yaml_text(v) for v in prop["enum"])
    kind = prop.get("type", "any")
    if kind == "array" and "items" in prop:
        return f"list[{_type_text(prop['items'], defs)}]"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"dict[str, {_type_text(values, defs)}]" if isinstance(values, dict) else "mapping"
    names = {
        "integer": "int",
        "number": "float",
        "boolean": "bool",
        "string": "str",
        "null": "null",
    }
    return names.get(str(kind), str(kind))


CONSTRAINTS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "length >= {}",
    "maxLength": "length <= {}",
    "minItems": "items >= {}",
    "maxItems": "items <= {}",
    "pattern": "matches `{}`",
    "multipleOf": "multiple of {}",
}


def _constraints(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    found = [text.format(prop[key]) for key, text in CONSTRAINTS.items() if key in prop]
    for option in prop.get("anyOf", []) + prop.get("oneOf", []):
        found.append(_constraints(_deref(option, defs), defs))
    return ", ".join(dict.fromkeys(f for f in found if f))


def _yaml_text(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()
