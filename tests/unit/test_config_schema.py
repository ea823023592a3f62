"""The config's JSON Schema (legato.config_schema) accepts every shipped config, refuses each planted mistake that the
config loader refuses too, and is what `legato schema` prints; checked by jsonschema, the validator editors use."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import ROOT

from legato.config import config_from_dict
from legato.config_schema import json_schema
from legato.errors import UsageError
from legato.orchestrator.cli import main

SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def _loaded(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_schema_is_valid_and_accepts_every_shipped_config() -> None:
    jsonschema.Draft202012Validator.check_schema(json_schema())
    assert len(SHIPPED) >= 5
    for path in SHIPPED:
        assert [e.message for e in VALIDATOR.iter_errors(_loaded(path))] == [], path.name


PLANTED = {
    "unknown key": ("checkpoint", "every_step", 5),
    "misspelt section": (None, "chekpoint", {"every_steps": 5}),
    "text for a number": ("train", "steps", "many"),
    "below its bound": ("checkpoint", "keep_last", 0),
    "not a choice": ("train", "parallel", "zero3"),
    "a number for a switch": ("checkpoint", "reshard", 1),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_mistake_is_refused_by_the_schema_and_by_the_loader(name: str) -> None:
    section, key, value = PLANTED[name]
    raw = _loaded(ROOT / "configs" / "tiny_gpt.yaml")
    (raw.setdefault(section, {}) if section else raw)[key] = value
    assert not VALIDATOR.is_valid(raw), name
    with pytest.raises(UsageError):
        config_from_dict(raw, required=True)


def test_a_key_a_file_must_say_is_required() -> None:
    raw = _loaded(ROOT / "configs" / "tiny_gpt.yaml")
    del raw["train"]["steps"]
    assert any("'steps' is a required property" in e.message for e in VALIDATOR.iter_errors(raw))
    raw = _loaded(ROOT / "configs" / "tiny_gpt.yaml")
    raw["train"].pop("task", None)
    raw["train"].pop("entrypoint", None)
    assert not VALIDATOR.is_valid(raw)
    raw["train"]["entrypoint"] = "mypkg.train:main"
    assert VALIDATOR.is_valid(raw)


def test_legato_schema_prints_it() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["schema"]) == 0
    assert json.loads(out.getvalue()) == json.loads(json.dumps(json_schema()))
    assert json.loads(out.getvalue())["properties"]["checkpoint"]["properties"]["every_minutes"]["default"] == 10.0
