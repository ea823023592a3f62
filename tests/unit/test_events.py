"""The event vocabulary: one module spells every kind, the kinds round-trip through the ledger as the same strings,
and a script's Session records its resumes where `legato verify --command` reads them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import ROOT

from legato.event_fields import FIELDS, JOB_TAG_FIELDS, field_names
from legato.events import NOT_IN_LEDGER, TERMINAL, Kind
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.verify import compare_runs
from legato.recorder import LedgerRecorder

SCANNED = ("trainer", "orchestrator", "slurm")
VOCABULARY = Path("trainer/events.py")
# The same words in another sense: checkpoint.verify's value "error" (the setting, not the report).
OTHER_SENSE = {
    Path("trainer/config.py"): {"error"},
    Path("trainer/session/policy.py"): {"error"},
}


def spelled_kinds(root: Path) -> list[str]:
    """Every string literal naming an event kind outside the vocabulary, as "path:line: literal".

    A literal used as a subscript (`command["error"]`) is a key of some other record and is not counted."""
    values = {k.value for k in Kind}
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if rel == VOCABULARY:
                continue
            tree = ast.parse(path.read_text())
            keys = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}
            allowed = OTHER_SENSE.get(rel, set())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in values and node.value not in allowed and id(node) not in keys:
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_each_kind_is_spelled_in_the_vocabulary_alone() -> None:
    assert spelled_kinds(ROOT) == []


def test_the_scan_catches_a_planted_kind(tmp_path: Path) -> None:
    for top in SCANNED:
        (tmp_path / top).mkdir()
    (tmp_path / "orchestrator" / "newreader.py").write_text(
        'def resumes(events):\n    return [e for e in events if e["event"] == "resumed" and e["step"]]\n'
    )
    (tmp_path / "trainer" / "events.py").write_text('RESUMED = "resumed"\n')
    assert spelled_kinds(tmp_path) == ["orchestrator/newreader.py:2: 'resumed'"]


def test_a_kind_is_its_plain_string_in_json_text_and_comparisons() -> None:
    assert json.dumps({"event": Kind.RESUMED}) == '{"event": "resumed"}'
    assert f"{Kind.RESUMED}" == str(Kind.RESUMED) == "resumed"
    assert Kind.RESUMED == "resumed" and "finished" in TERMINAL and {Kind.FAILED: 1}.get("failed") == 1
    assert len({k.value for k in Kind}) == len(Kind) == len(FIELDS)


def _sample(name: str) -> object:
    return {"job_id": "7", "restart": 1, "match": True, "replay": None}.get(name, f"{name}-value")


def test_every_ledger_kind_round_trips_through_the_ledger(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    kinds = [k for k in Kind if k not in NOT_IN_LEDGER]
    for kind in kinds:
        ledger.append(kind, **{name: _sample(name) for name in sorted(field_names(kind))})
    read = ledger.read()
    assert [Kind(e["event"]) for e in read] == kinds
    for kind, e in zip(kinds, read):
        assert set(e) - {"event", "time"} == field_names(kind)
        assert all(e[name] == _sample(name) for name in field_names(kind))
    raw = [json.loads(line)["event"] for line in ledger.path.read_text().splitlines()]
    assert raw == [k.value for k in kinds] and all(type(r) is str for r in raw)


def _resumed_report(rank: int) -> dict:
    """What the Session hands its `on_event` after a replay-verified resume."""
    replay = {"identical": True, "steps": 3, "from_step": 2, "first_divergence": None}
    return {
        "event": "resumed",
        "rank": rank,
        "step": 5,
        "path": "/run/checkpoints/step_5",
        "expected_hash": "ab",
        "recomputed_hash": "ab",
        "match": True,
        "mismatches": {},
        "replay": replay,
        "resharded": None,
    }


def test_a_scripts_session_records_rank_0s_resumes_where_verify_reads_them(tmp_path: Path) -> None:
    run = tmp_path / "interrupted"
    recorder = LedgerRecorder(run)
    recorder({"event": "progress", "rank": 0, "step": 4, "total_steps": 9, "epoch": 0, "loss": 1.0})
    recorder(_resumed_report(rank=1))
    recorder(_resumed_report(rank=0))
    (record,) = Ledger(run).read()
    assert record["event"] == "resumed" and set(record) - {"event", "time"} == field_names(Kind.RESUMED) - JOB_TAG_FIELDS
    assert record["replay"]["identical"] and record["match"]
    verdict = compare_runs(tmp_path / "reference", run)
    assert verdict.resumes == [
        {
            "step": 5,
            "match": True,
            "mismatches": {},
            "replay": _resumed_report(0)["replay"],
            "job_id": None,
            "restart": None,
            "resharded": None,
        }
    ]


@pytest.mark.parametrize("kind", sorted(TERMINAL))
def test_terminal_kinds_are_ledger_kinds(kind: Kind) -> None:
    assert kind not in NOT_IN_LEDGER and kind in FIELDS
