"""Rank 0's decision at the end of an attempt, in-process against a real ledger file (no job runs)."""

from __future__ import annotations

from pathlib import Path

from legato.config import load_config
from legato.events import TERMINAL, Kind
from legato.orchestrator.job_events import JobEvents
from legato.orchestrator.jobside import Identity, _decide
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.supervisor import start_session


def _ended_attempt(tmp_path: Path, *, cancelled: bool) -> tuple[str, list[dict]]:
    cfg = load_config(None, [f"run.dir={tmp_path / 'run'}"])
    ledger = Ledger(cfg.run_dir)
    start_session(cfg, ledger, ["legato", "run"])
    ident = Identity("local", "123", 0, 0, 2, 0, 2, ("localhost",))
    if cancelled:
        ledger.append(Kind.CANCEL_REQUESTED, job_id="123")
    decision = _decide(cfg, ledger, ident, 1, JobEvents(ledger, ident.tag(), ident.rank, tmp_path / "progress.json"), 0)
    return decision, [e for e in ledger.read() if e["event"] in TERMINAL]


def test_an_attempt_the_user_cancelled_is_not_recorded_as_failed_by_rank_0(tmp_path: Path) -> None:
    decision, terminal = _ended_attempt(tmp_path, cancelled=True)
    assert decision == Kind.CANCELLED
    assert terminal == []


def test_an_attempt_that_crashed_without_a_cancel_is_recorded_as_failed(tmp_path: Path) -> None:
    decision, terminal = _ended_attempt(tmp_path, cancelled=False)
    assert decision == Kind.FAILED
    assert [e["event"] for e in terminal] == [Kind.FAILED]


def test_the_job_side_writes_every_field_of_a_resume_the_session_reports(tmp_path: Path) -> None:
    """`legato status`'s resume time comes from the ledger: a field the Session reports must not be dropped on the way."""
    from legato.event_fields import JOB_TAG_FIELDS, field_names

    ledger = Ledger(tmp_path / "run")
    ident = Identity("local", "123", 1, 0, 2, 0, 2, ("localhost",))
    fields = {name: f"value of {name}" for name in field_names(Kind.RESUMED) - JOB_TAG_FIELDS} | {"step": 7}
    JobEvents(ledger, ident.tag(), ident.rank, tmp_path / "progress.json")({"event": Kind.RESUMED, **fields})
    [written] = [e for e in ledger.read() if e["event"] == Kind.RESUMED]
    assert {name: written[name] for name in fields} == fields
