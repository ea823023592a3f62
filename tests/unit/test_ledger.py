"""The ledger: torn lines after a crash are skipped, concurrent writers never interleave."""

from __future__ import annotations

import io
import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

from legato.orchestrator.display import LiveView, status_table
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.status import summarize
from legato.voice import counted


def test_torn_last_line_is_ignored_and_the_next_append_starts_fresh(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.append("run_started", total_steps=10)
    with open(ledger.path, "ab") as f:
        f.write(b'{"event": "checkpoint_commi')  # a crash in the middle of a write
    assert [e["event"] for e in ledger.read()] == ["run_started"]
    ledger.append("submitted", job_id="7")
    assert [e["event"] for e in ledger.read()] == ["run_started", "submitted"]
    assert ledger.path.read_bytes().endswith(b"\n")


def _append_many(run_dir: str, writer: int) -> None:
    ledger = Ledger(run_dir)
    for i in range(150):
        ledger.append("tick", writer=writer, i=i, padding="x" * 300)


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 450
    records = [json.loads(line) for line in lines]  # every line parses: no interleaving
    for w in range(3):
        assert [r["i"] for r in records if r["writer"] == w] == list(range(150))


def test_summary_marks_unverified_resume_and_resubmission(tmp_path: Path) -> None:
    events = [
        {"event": "run_started", "time": 1, "total_steps": 30},
        {"event": "submitted", "time": 1, "job_id": "5"},
        {"event": "attempt_started", "time": 2, "job_id": "5", "restart": 0, "hosts": ["a"], "world_size": 2},
        {
            "event": "checkpoint_committed",
            "time": 3,
            "job_id": "5",
            "restart": 0,
            "step": 10,
            "seconds": 0.1,
            "global_hash": "h",
            "bytes": 1,
            "reason": "periodic",
        },
        {"event": "resubmitted", "time": 4, "job_id": "6", "previous_job_id": "5", "reason": "NODE_FAIL"},
        {"event": "attempt_started", "time": 5, "job_id": "6", "restart": 0, "hosts": ["b"], "world_size": 2},
        {
            "event": "resumed",
            "time": 6,
            "job_id": "6",
            "restart": 0,
            "step": 10,
            "expected_hash": "h",
            "recomputed_hash": "g",
            "match": False,
            "mismatches": {"0": ["rng.numpy"]},
        },
    ]
    summary = summarize(tmp_path, events)
    first, second = summary.attempts
    assert first.ended == "ended (NODE_FAIL), resubmitted" and first.steps_run == 10
    assert second.verified is False and second.resumed_from_step == 10
    assert not summary.all_resumes_verified and summary.state == "failed" and second.ended == "resume not verified"
    assert summary.failure is not None and summary.failure.startswith(
        "resume not verified at step 10: restored state differs (rank 0: rng.numpy)"
    )
    assert "LEGATO_RESUME=unverified" in summary.failure
    went_on = summarize(
        tmp_path,
        [
            *events,
            {
                "event": "continued_unverified",
                "time": 7,
                "job_id": "6",
                "restart": 0,
                "step": 10,
                "components": ["rng.numpy"],
                "how": "LEGATO_RESUME=unverified",
            },
        ],
    )
    assert went_on.state == "running" and went_on.failure is None and went_on.attempts[1].continued_unverified
    assert went_on.unverified == {"step": 10, "components": ["rng.numpy"], "how": "LEGATO_RESUME=unverified"}


def test_summary_status_table_and_json_show_each_attempts_replay(tmp_path: Path) -> None:

    tag = {"job_id": "5", "time": 2, "hosts": ["a"], "world_size": 2}
    identical = {"from_step": 4, "steps": 4, "identical": True, "first_divergence": None, "differing_at_end": {}}
    diverged = {"from_step": 12, "steps": 3, "identical": False, "first_divergence": {"step": 13, "rank": 1, "cause": "a prefetched batch"}}
    resumed = {"event": "resumed", "time": 3, "expected_hash": "h", "recomputed_hash": "h", "mismatches": {}, "seconds": 1.25}
    events = [
        {"event": "run_started", "time": 1, "total_steps": 30},
        {"event": "attempt_started", "restart": 0, **tag},
        {"event": "attempt_started", "restart": 1, **tag},
        {**resumed, "job_id": "5", "restart": 1, "step": 8, "match": True, "replay": identical},
        {"event": "attempt_started", "restart": 2, **tag},
        {"event": "replay_stopped", "time": 4, "job_id": "5", "restart": 2, "step": 6, "checkpoint_step": 8},
        {"event": "attempt_started", "restart": 3, **tag},
        {**resumed, "job_id": "5", "restart": 3, "step": 15, "match": False, "replay": diverged},
    ]
    summary = summarize(tmp_path, events)
    assert [a.replay_text for a in summary.attempts] == ["-", "replay ✓ 4 steps", "replay stopped at step 6", "replay ✗ at step 13"]
    assert [a["replay"] for a in summary.to_json()["attempts"]] == [None, identical, {"stopped_at": 6, "checkpoint_step": 8}, diverged]
    assert not summary.all_resumes_verified
    table = status_table(summary)
    assert "replay ✓ 4 steps" in table and "replay ✗ at step 13" in table and "replay stopped at step 6" in table
    assert "resume s" in table and "1.25" in table and [a.resume_seconds for a in summary.attempts] == [None, 1.25, None, 1.25]


def test_status_shows_the_replays_own_seconds_beside_its_steps(tmp_path: Path) -> None:
    """The replay's own time (the Session's verdict carries it) is shown with its steps; older ledgers lack it."""

    tag = {"job_id": "5", "time": 2, "hosts": ["a"], "world_size": 2}
    replay = {"from_step": 20, "steps": 6, "identical": True, "first_divergence": None, "differing_at_end": {}, "seconds": 0.515}
    events = [
        {"event": "run_started", "time": 1, "total_steps": 40},
        {"event": "attempt_started", "restart": 0, **tag},
        {"event": "attempt_started", "restart": 1, **tag},
        {
            "event": "resumed",
            "time": 3,
            "job_id": "5",
            "restart": 1,
            "step": 26,
            "expected_hash": "h",
            "recomputed_hash": "h",
            "mismatches": {},
            "match": True,
            "replay": replay,
            "seconds": 1.75,
        },
    ]
    summary = summarize(tmp_path, events)
    assert summary.attempts[1].replay_text == "replay ✓ 6 steps in 0.52s"
    table = status_table(summary)
    assert "replay ✓ 6 steps in 0.52s" in table and "1.75" in table
    assert summary.to_json()["attempts"][1]["replay"]["seconds"] == 0.515


def test_a_checkpoint_whose_ranks_held_differing_replicated_state_is_shown_with_a_warning() -> None:
    """The supervisor's line for such a checkpoint names the ranks; a checkpoint without (and older ledgers) reads as before."""
    view = LiveView(io.StringIO())
    record = {
        "event": "checkpoint_committed",
        "time": 2,
        "job_id": "5",
        "restart": 0,
        "step": 20,
        "global_hash": "ab" * 16,
        "seconds": 0.5,
        "bytes": 2**20,
        "reason": "periodic",
    }
    plain = view.event_line(record)
    flagged = view.event_line({**record, "diverged": {"1": ["model:0"], "0": ["optimizer:2"]}})
    assert plain is not None and "WARNING" not in plain
    assert flagged == plain + (
        "; WARNING: rank(s) 0, 1 held replicated state that differs from the copy saved for every rank, so a "
        "resume from it will fail its verification (see the rank's log)"
    )


def test_a_checkpoint_held_by_its_replay_says_so_and_its_size_in_kib() -> None:
    """A stop checkpoint that holds its state as the replay from an earlier checkpoint writes a few records: its line names
    that checkpoint and the steps to replay, so that "0.0 MiB" does not read as an empty checkpoint."""
    view = LiveView(io.StringIO())
    record = {
        "event": "checkpoint_committed",
        "time": 2,
        "job_id": "5",
        "restart": 0,
        "step": 41,
        "global_hash": "ab" * 16,
        "seconds": 0.08,
        "bytes": 12 * 2**10,
        "reason": "signal",
    }
    assert "(12 KiB)" in view.event_line(record)
    line = view.event_line({**record, "replays_from": 40})
    assert "(the state of step 40 and 1 step to replay from it; 12 KiB written)" in line, line
    assert "3 steps to replay" in view.event_line({**record, "step": 43, "replays_from": 40})
    assert "(1.5 MiB)" in view.event_line({**record, "bytes": 3 * 2**19})


def test_a_replay_of_one_step_reads_as_one_step() -> None:
    assert (counted(1, "step"), counted(0, "step"), counted(4, "step")) == ("1 step", "0 steps", "4 steps")
    view = LiveView(io.StringIO())
    replay = {"identical": True, "steps": 1, "from_step": 20, "first_divergence": None, "seconds": 0.05}
    line = view.event_line(
        {
            "event": "resumed",
            "time": 2,
            "job_id": "5",
            "restart": 1,
            "step": 21,
            "expected_hash": "ab" * 16,
            "recomputed_hash": "ab" * 16,
            "match": True,
            "mismatches": {},
            "replay": replay,
            "seconds": 0.12,
        }
    )
    assert "replay ✓ 1 step from step 20 in 0.05s" in line, line


def test_status_names_what_the_census_found_with_or_without_a_resume(tmp_path: Path) -> None:
    """The census's findings reach `legato status`, not only the start of a rank's stderr; a resume says it verified without."""
    tag = {"job_id": "7", "time": 2, "hosts": ["a"], "world_size": 2}
    found = {
        "event": "unsaved_state",
        "time": 3,
        "job_id": "7",
        "restart": 0,
        "step": 2,
        "when": "early",
        "strict": False,
        "objects": [],
        "names": ["losses_m"],
    }
    events = [{"event": "attempt_started", "restart": 0, **tag}, found]
    assert "the census found state legato does not save: losses_m (register each one training changes" in status_table(
        summarize(tmp_path, events)
    )
    resumed = {
        "event": "resumed",
        "time": 4,
        "job_id": "7",
        "restart": 1,
        "step": 4,
        "expected_hash": "h",
        "recomputed_hash": "h",
        "match": True,
        "mismatches": {},
        "unregistered": ["losses_m", "saver"],
    }
    summary = summarize(tmp_path, [*events, {"event": "attempt_started", "restart": 1, **tag}, resumed])
    table = status_table(summary)
    assert summary.unregistered == ["losses_m", "saver"] and "✓ except 2" in table
    assert "resumes verified, except 2 unregistered objects: losses_m, saver" in table


def test_a_resume_that_fell_back_past_a_corrupt_checkpoint_says_so_everywhere(tmp_path: Path) -> None:
    """The `resumed` record's `skipped` (legato.session.resume): the supervisor's line, the table and --json."""
    why = "step_13: replay_rank1.pt does not match its digest"
    tag = {"job_id": "5", "time": 2, "hosts": ["a"], "world_size": 2}
    resumed = {"event": "resumed", "time": 3, "job_id": "5", "restart": 1, "step": 10, "match": True, "replay": None}
    events = [
        {"event": "run_started", "time": 1, "total_steps": 30, "executor": "local", "world_size": 2},
        {"event": "attempt_started", "restart": 0, **tag},
        {"event": "attempt_started", "restart": 1, **tag},
        {**resumed, "expected_hash": "h", "recomputed_hash": "h", "mismatches": {}, "skipped": [why]},
    ]
    view = LiveView()
    lines = [view.event_line(e) for e in events]
    assert lines[-1] is not None and lines[-1].endswith(f"FELL BACK past 1 checkpoint(s) that did not verify: {why}"), lines
    summary = summarize(tmp_path, events)
    assert [a["skipped"] for a in summary.to_json()["attempts"]] == [[], [why]]
    table = status_table(summary)
    assert "10 (fell back)" in table and f"attempt 2 fell back past {why}" in table, table
    # Without `skipped` (the newest verified, or a ledger older than the field) nothing is said.
    del events[-1]["skipped"]
    assert "FELL BACK" not in (LiveView().event_line(events[-1]) or "") and "fell back" not in status_table(summarize(tmp_path, events))


def test_lost_work_is_charged_to_the_attempt_that_trained_it(tmp_path: Path) -> None:
    tag = {"job_id": "script", "time": 2, "hosts": ["a"], "world_size": 2}
    events = [
        {"event": "attempt_started", "restart": 0, **tag},
        {"event": "attempt_started", "restart": 1, **tag},
        {"event": "work_lost", "time": 3, "job_id": "script", "restart": 1, "step": 4, "trained_to": 11, "lost_steps": 7},
        {"event": "attempt_started", "restart": 2, **tag},
    ]
    summary = summarize(tmp_path, events)
    assert [a.lost_steps for a in summary.attempts] == [7, 0, 0] and summary.to_json()["lost_steps"] == 7
    table = status_table(summary)
    assert "7 steps lost" in table and "lost work: 7 steps" in table


def test_off_a_terminal_a_progress_reading_without_a_rate_prints_nothing() -> None:
    out = io.StringIO()
    view = LiveView(out)
    reading = {"event": "progress", "job_id": "script", "restart": 0, "step": 1, "total_steps": 10, "loss": 0.5}
    view("progress", {**reading, "steps_per_s": None})
    assert out.getvalue() == ""
    view("progress", {**reading, "step": 4, "steps_per_s": 2.0})
    assert "| 2.0 steps/s | ETA 0m03s" in out.getvalue()


def test_an_append_the_disk_refuses_midway_leaves_no_half_line(tmp_path: Path) -> None:
    """A real short write: a child process whose file size limit (RLIMIT_FSIZE) stops the record's bytes part way (the
    kernel's EFBIG, as a full disk's ENOSPC would). The append raises, and takes back what it wrote of the record: every
    line of the ledger is still whole JSON, the next append lands on its own line."""
    Ledger(tmp_path).append("run_started", total_steps=10)
    size = (tmp_path / "ledger.jsonl").stat().st_size
    child = textwrap.dedent(
        f"""
        import resource, signal, sys
        from legato.ledger_file import record
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({size} + 20, {size} + 20))
        try:
            record({str(tmp_path)!r}, "submitted", job_id="7", note="x" * 200)
        except OSError as exc:
            print("refused", exc.errno)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("refused"), proc.stdout + proc.stderr
    assert (tmp_path / "ledger.jsonl").stat().st_size == size
    Ledger(tmp_path).append("submitted", job_id="8")
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["run_started", "submitted"]
