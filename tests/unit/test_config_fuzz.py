"""The config fuzz of issue 25, in-process through the entry point `legato run` itself uses (`checked_config`).

The shipped configs, mutated key by key with hostile YAML: tags beyond the core schema (dates, `!!binary`, `!!set`,
`!!omap`, `!!python/...`), non-text keys, control characters and CRs, `..`, `~` and `/` in paths and names,
non-finite and out-of-range numbers, task options that no rank could train, deleted required keys and sections,
then up to two `--set` values more; and `--set` values alone against a good file. Half the examples run with
SLURM's commands missing from PATH. Every example ends in a valid config or a `UsageError` of one paragraph, never
another exception, and nothing is written. `test_config_errors.py` holds the named cases and the first fuzz over
generic documents; `tests/e2e/test_run_errors.py` the same shapes through the real CLI. Examples are derandomized
(the same ones every run) so that CI is reproducible; the counts here are what docs/hardening.md reports.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from unittest import mock

import pytest
import yaml
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legato.config import Config
from legato.config_build import yaml_key
from legato.errors import UsageError
from legato.orchestrator.preflight import checked_config
from legato.tasks.options import SCHEMAS

DOCUMENTS = 700  # mutated shipped configs, each with up to two --set values
SET_LISTS = 400  # one to three --set values against a good config
FUZZ = settings(
    deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

SHIPPED = {path.stem: yaml.safe_load(path.read_text()) for path in sorted((ROOT / "configs").glob("*.yaml"))}
SECTIONS = [yaml_key(f) for f in dataclasses.fields(Config) if f.name != "executor"]
LEAVES = (
    ["executor"]
    + [f"{section}.{yaml_key(f)}" for section in SECTIONS for f in dataclasses.fields(getattr(Config(), section))]
    + sorted({f"train.options.{name}" for schema in SCHEMAS.values() for name in schema})
    + [
        "train.options.head",
        "train.options.x",
        "train.options.nested",
        "train.stepz",
        "run.nmae",
        "x",
    ]
)
ENTRYPOINTS = ["nosuch_legato_pkg.mod:main", "'a b:c'", "json:loads", "os.path:join", "null", "1", "'pkg.mod'"]
FRAGMENTS = [
    # tags beyond the core schema, and keys that are not text
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!pairs [a: 1]",
    "2024-01-01",
    "2001-12-14t21:59:43.10-05:00",
    "!!python/tuple [1]",
    "!!python/object/apply:os.system ['touch /tmp/legato-pwned']",
    "!foo 1",
    "!<tag:example.com,2000:a> 1",
    "{1: a, b: c}",
    "{true: 1}",
    "{null: 1}",
    "{2024-01-01: x}",
    "{on: 1}",
    "{1.5: x}",
    "=",
    "!!str 5",
    "!!int '7'",
    "!!float 3",
    # numbers
    ".nan",
    "-.inf",
    ".inf",
    "1e999",
    "1e-3",
    "-1",
    "0",
    "1",
    "2",
    "3",
    "8",
    "64",
    "1.5",
    "0.5",
    "99999999999999999999",
    "4096",
    "200000",
    "true",
    "no",
    "null",
    "~",
    # names and paths
    "a/b",
    "../x",
    "a/../b",
    "~/x",
    "'~'",
    "'  padded '",
    "''",
    "/proc/x",
    "/dev/null",
    "runs/ok",
    "'a//b/./c/'",
    "..",
    ".",
    '"a\\rb"',
    '"a\\r\\nb"',
    '"a\\nb"',
    '"a\\tb"',
    '"\\x01"',
    '"\\x7f"',
    '"\\u0085"',
    '"\\u2028"',
    '"\\0"',
    '"line\\n#SBATCH --x"',
    # words that mean something to some key
    "KILL",
    "USR2",
    "SIGUSR1",
    "mlp",
    "tiny_gpt",
    "slurm",
    "local",
    "gloo",
    "cuda",
    "strict",
    "warn",
    "auto",
    "float16",
    "[python, numpy]",
    "[cuda]",
    "[1, 2, 3]",
    "[-1]",
    "[.nan]",
    "[a, [b]]",
    "[]",
    "{}",
    "{a: .nan}",
    "{x: [1, {y: .inf}]}",
    "{constraint: gpu}",
    "{'x y': 1}",
    '{comment: "a\\nb"}',
    "{heads: 5}",
    "{dim: 8, heads: 4}",
    "{samples: 1}",
]
VALUES = st.one_of(  # the fragments twice: random text is mostly refused for its type, before any other check sees it
    st.sampled_from(FRAGMENTS),
    st.sampled_from(FRAGMENTS),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(repr),
    st.text(alphabet=st.characters(max_codepoint=0x2030), max_size=24).map(json.dumps),
)


def _value_for(key: str, value: str, entrypoint: str) -> str:
    """Entrypoints are imported by the check: only ones chosen here, never random text that might name a real module."""
    return entrypoint if key.endswith("entrypoint") else value


def _default(key: str) -> object:
    node: object = {
        **Config().to_dict(),
        "train": {
            **Config().to_dict()["train"],
            "options": {name: spec[1] for schema in SCHEMAS.values() for name, spec in schema.items()},
        },
    }
    for part in key.split("."):
        node = node.get(part, 1) if isinstance(node, dict) else 1
    return node


# Each key's default, and small numbers: without them nearly every example would be refused by its first wrong type.
def _plausible(key: str) -> list[str]:
    default = _default(key)
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    return [json.dumps(default), *(["2", "16", "0.25"] if numeric else [])]


PLAUSIBLE = {key: _plausible(key) for key in LEAVES + SECTIONS}
# The keys whose shapes issue 25 is about, drawn more often than the rest.
KEYS = LEAVES + SECTIONS + 4 * ["train.steps", "train.task", "run.name", "run.dir", "train.options.heads", "train.options.x"]
KEYED_VALUES = st.sampled_from(KEYS).flatmap(
    lambda key: st.tuples(st.just(key), st.one_of(st.sampled_from(PLAUSIBLE[key]), VALUES), st.sampled_from(ENTRYPOINTS))
)
MUTATION = st.tuples(st.sampled_from(["set", "set", "delete"]), KEYED_VALUES).map(lambda m: (m[0], *m[1]))
SET = KEYED_VALUES.map(lambda kv: f"{kv[0]}={_value_for(*kv)}")


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def mutated(base: dict, mutations: list[tuple[str, str, str, str]]) -> str:
    """The YAML text of `base` with each mutation applied: a key deleted, or set to a raw YAML fragment."""
    doc = copy.deepcopy(base)
    doc["run"]["dir"] = "fuzz-run"
    fragments = {}
    for index, (kind, key, value, entrypoint) in enumerate(mutations):
        *parents, name = key.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if kind == "delete":
            node.pop(name, None)
            continue
        node[name] = f"FUZZ{index}"
        fragments[f"FUZZ{index}"] = _value_for(key, value, entrypoint)
    text = yaml.safe_dump(doc, sort_keys=False, width=10_000)
    for placeholder, fragment in fragments.items():
        text = text.replace(f" {placeholder}\n", f" {fragment}\n")
    return text


def outcome(path: Path, sets: list[str], root: Path, slurm_tools: bool) -> str:
    """Check one config as `legato run` would: valid, or refused in one paragraph; nothing written either way."""
    before = tree_digest(root)
    path_env = os.environ["PATH"] if slurm_tools else str(root / "empty-bin")
    with mock.patch.dict(os.environ, {"PATH": path_env}):
        try:
            checked = checked_config(path, sets)
        except UsageError as exc:
            message = str(exc)
            assert message and "\n" not in message and "Traceback" not in message and len(message) < 1200, message[:300]
            result = "refused"
        else:
            assert isinstance(checked.cfg, Config)
            result = "valid"
    assert tree_digest(root) == before
    assert not (root / "fuzz-run").exists()
    assert not Path("/tmp/legato-pwned").exists()
    return result


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # relative run.dir values land here, where the digest looks
    return tmp_path


@settings(FUZZ, max_examples=DOCUMENTS)
@given(
    base=st.sampled_from(sorted(SHIPPED)),
    mutations=st.lists(MUTATION, min_size=1, max_size=3),
    sets=st.lists(SET, max_size=2),
    slurm_tools=st.booleans(),
)
def test_fuzz_mutated_shipped_configs(workdir: Path, base: str, mutations: list, sets: list[str], slurm_tools: bool) -> None:
    path = workdir / "fuzz.yaml"
    path.write_text(mutated(SHIPPED[base], mutations))
    outcome(path, sets, workdir, slurm_tools)


@settings(FUZZ, max_examples=SET_LISTS)
@given(sets=st.lists(SET, min_size=1, max_size=3), slurm_tools=st.booleans())
def test_fuzz_set_values(workdir: Path, sets: list[str], slurm_tools: bool) -> None:
    path = workdir / "good.yaml"
    if not path.exists():
        doc = copy.deepcopy(SHIPPED["tiny_gpt"])
        doc["run"]["dir"] = "fuzz-run"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    outcome(path, sets, workdir, slurm_tools)


def test_the_fuzz_reaches_both_outcomes_and_every_shape(workdir: Path) -> None:
    """The fuzz is only worth its count if its documents are both valid and refused, and its shapes parse as meant."""
    good = workdir / "good.yaml"
    good.write_text(mutated(SHIPPED["tiny_gpt"], []))
    assert outcome(good, [], workdir, slurm_tools=True) == "valid"
    for fragment in ("!!binary aGVsbG8=", "2024-01-01", '"a\\rb"', "../x"):
        path = workdir / "one.yaml"
        path.write_text(mutated(SHIPPED["tiny_gpt"], [("set", "run.dir", fragment, "")]))
        assert outcome(path, [], workdir, slurm_tools=True) == "refused", fragment
    deleted = workdir / "deleted.yaml"
    deleted.write_text(mutated(SHIPPED["tiny_gpt"], [("delete", "train.steps", "", "")]))
    with pytest.raises(UsageError, match="train.steps is missing"):
        checked_config(deleted)
    assert outcome(good, ["executor=slurm"], workdir, slurm_tools=False) == "refused"
