"""The run configuration as a JSON Schema, generated from the one schema in legato.config, for editors that complete
and check a config's keys as it is written (`legato schema > legato-config.schema.json`).

Each section is an object of its known keys only (additionalProperties false), each key with its type, its bounds,
its choices, its default and its documentation; the keys a config file must say (legato.config.REQUIRED) are
required. The schema is a guide for editors: loading a config (legato.config.load_config) stays the check, and also
refuses what a schema cannot say (keys that disagree with each other, texts a setting must not hold). This module must
never hold a setting of its own: every key, bound and default comes from legato.config.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from legato.config import REQUIRED, Config
from legato.config_build import yaml_key

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# A number YAML 1.1 reads as text (1e-3, without a dot): the config reads it as the number it spells.
FLOAT_TEXT = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
_TYPES: dict[type, dict[str, Any]] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": ["number", "string"], "pattern": FLOAT_TEXT},
    str: {"type": "string"},
    list: {"type": "array"},
    dict: {"type": "object"},
}


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config file."""
    schema = {"$schema": SCHEMA_DIALECT, "title": "legato run configuration", **_section(Config)}
    for keys in REQUIRED:
        _require(schema, [key.split(".") for key in keys])
    return schema


def _section(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        # A hint is a class, never an instance.
        properties[yaml_key(f)] = _section(hint) if isinstance(hint, type) and dataclasses.is_dataclass(hint) else _key(f, hint)
    return {"type": "object", "description": (cls.__doc__ or "").strip(), "properties": properties, "additionalProperties": False}


def _key(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """One key: its type (null where it may be unset), bounds, choices, default and documentation."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    base = next(t for t in allowed if t is not type(None))
    out: dict[str, Any] = dict(_TYPES[typing.get_origin(base) or base])
    if type(None) in allowed:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    meta = f.metadata
    if meta.get("minimum") is not None:
        out["minimum"] = meta["minimum"]
    if meta.get("maximum") is not None:
        out["maximum"] = meta["maximum"]
    if meta.get("choices"):
        out["enum"] = list(meta["choices"])
    if f.default is not dataclasses.MISSING:
        default = f.default
    else:
        assert f.default_factory is not dataclasses.MISSING  # every key of the schema has a default
        default = f.default_factory()
    return {**out, "default": default, "description": meta.get("doc", "")}


def _require(schema: dict[str, Any], alternatives: list[list[str]]) -> None:
    """Require one of `alternatives` (key paths in one section, as "train.task" or "train.entrypoint")."""
    section = alternatives[0][:-1]
    schema.setdefault("required", [])
    if section[0] not in schema["required"]:
        schema["required"].append(section[0])
    target = schema["properties"][section[0]]
    names = [path[-1] for path in alternatives]
    if len(names) == 1:
        target.setdefault("required", []).extend(names)
    else:
        target.setdefault("allOf", []).append({"anyOf": [{"required": [name]} for name in names]})
