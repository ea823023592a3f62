"""Goodput's arithmetic on a planted ledger: every bucket of two attempts (the first killed, the second stopped before
its time limit), their sum against the wall time, and the costs that must not count (a checkpoint written in the
background while the loop trained on). The same from real ranks, stopped and killed from outside, is
tests/e2e/test_run_goodput.py."""

from __future__ import annotations

from pathlib import Path

from legato.orchestrator.display import goodput_line, status_table
from legato.orchestrator.plot import lost_spans
from legato.orchestrator.status import summarize

TAG1 = {"job_id": "script", "restart": 0}
TAG2 = {"job_id": "script", "restart": 1}


def ledger(background_seconds: float = 5.0) -> list[dict]:
    """Two attempts of a script run, times in seconds from an arbitrary origin."""
    started = {"executor": "script", "hosts": ["vm"], "world_size": 2, "master_addr": "127.0.0.1"}
    commit = {"global_hash": "ab" * 16, "bytes": 10}
    return [
        {"event": "attempt_started", "time": 102.0, "launched_at": 100.0, **TAG1, **started},
        {"event": "bucket_layout", "time": 103.0, "step": 0, "pinned": False, "reason": "fresh", **TAG1},
        {"event": "checkpoint_committed", "time": 110.0, "step": 10, "seconds": 1.0, "reason": "periodic", **commit, **TAG1},
        {
            "event": "checkpoint_committed",
            "time": 120.0,
            "step": 20,
            "seconds": background_seconds,
            "reason": "periodic",
            "background": True,
            **commit,
            **TAG1,
        },
        # killed here: no end record
        {"event": "attempt_started", "time": 127.0, "launched_at": 125.0, "ends_at": 200.0, **TAG2, **started},
        {"event": "bucket_layout", "time": 128.0, "step": 20, "pinned": True, "reason": "restored", **TAG2},
        {"event": "work_lost", "time": 128.1, "step": 20, "trained_to": 24, "lost_steps": 4, **TAG2},
        {
            "event": "resumed",
            "time": 130.0,
            "step": 20,
            "match": True,
            "expected_hash": "h",
            "recomputed_hash": "h",
            "replay": {"from_step": 16, "steps": 4, "identical": True, "seconds": 1.5},
            "seconds": 2.0,
            **TAG2,
        },
        {"event": "checkpoint_committed", "time": 140.0, "step": 30, "seconds": 2.0, "reason": "signal", **commit, **TAG2},
        {"event": "attempt_stopped", "time": 140.5, "step": 30, **TAG2},
    ]


def test_every_bucket_of_a_killed_and_a_stopped_attempt() -> None:
    summary = summarize(Path("run"), ledger())
    first, second = (a.spent for a in summary.attempts)
    # Killed: 17 s from its first step to its last record, less a synchronous checkpoint (the background one did not
    # block); 20 steps in 16 s, so the 4 lost steps took 3.2 s after that record.
    assert (first.queued, first.starting, first.replay, first.checkpoint, first.training, first.lost) == (0.0, 3.0, 0.0, 1.0, 16.0, 3.2)
    assert first.margin_s is None
    assert (second.queued, second.starting, second.replay, second.checkpoint, second.training, second.lost) == (
        125.0 - 123.2,
        3.0,
        1.5,
        2.0,
        9.0,
        0.0,
    )
    assert second.margin_s == 60.0  # ends_at 200 less the stop checkpoint's commit at 140
    assert summary.spent.wall == first.wall + second.wall
    assert round(summary.spent.wall, 9) == 140.5 - 100.0  # from the first launch to the last record
    assert summary.spent.goodput == 25.0 / 40.5 and summary.spent.margin_s == 60.0


def test_a_killed_attempt_is_taken_to_have_ended_at_the_latest_when_the_next_one_launched() -> None:
    """Its 4 lost steps at its mean step time would end it 3.2 s after its last record (120); the next attempt launched
    1 s after that record: the killed attempt lost 1 s, the next queued none, and the buckets still add up."""
    events = ledger()
    for e in events:
        if e["event"] == "attempt_started" and e["restart"] == 1:
            e["launched_at"] = 121.0
    summary = summarize(Path("run"), events)
    first, second = (a.spent for a in summary.attempts)
    assert (first.lost, second.queued) == (1.0, 0.0)
    assert round(summary.spent.wall, 9) == 140.5 - 100.0


def test_legato_plot_marks_the_span_a_kill_threw_away_and_nothing_when_none_was() -> None:
    assert lost_spans(ledger()) == [(20, 24)]
    assert lost_spans([e for e in ledger() if e["event"] != "work_lost"]) == []


def test_planted_fault_a_background_write_counted_as_blocking_would_eat_the_training() -> None:
    assert summarize(Path("run"), ledger(background_seconds=500.0)).attempts[0].spent.checkpoint == 1.0
    without_flag = ledger()
    del without_flag[3]["background"]
    planted = summarize(Path("run"), without_flag).attempts[0].spent
    assert planted.checkpoint == 6.0 and planted.training == 11.0  # what the flag keeps out


def test_the_status_table_and_json_carry_the_buckets() -> None:
    summary = summarize(Path("run"), ledger())
    line = goodput_line(summary.spent)
    assert line.startswith("goodput 62% of 40.5s: queued 1.8s, starting 6.0s, replay 1.5s, checkpoint 3.0s, lost 3.2s, training 25.0s")
    assert "committed 1m00s before its time limit" in line and line in status_table(summary)
    data = summary.to_json()
    assert data["spent"]["wall_s"] == 40.5 and data["attempts"][0]["spent"]["lost"] == 3.2


def test_a_run_started_by_legato_run_counts_its_first_queue() -> None:
    events = [{"event": "run_started", "time": 90.0, "total_steps": 30}, {"event": "submitted", "time": 91.0, "job_id": "7"}]
    events += [{**e, "job_id": "7"} for e in ledger()]
    first = summarize(Path("run"), events).attempts[0].spent
    assert first.queued == 10.0
