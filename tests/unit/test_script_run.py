"""A script's Session as a run: one run id however many processes race to create it, attempts counted from the
ledger, and the recorder's records folded by `legato status` into attempts that say how each ended."""

from __future__ import annotations

import io
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import files_under, fit_run, fit_step

from legato.dist.peers import Peers
from legato.events import Kind
from legato.ledger_file import read_records, record
from legato.orchestrator.display import LiveView
from legato.orchestrator.follow import watch_script
from legato.orchestrator.status import summarize
from legato.recorder import LedgerRecorder
from legato.session.identity import Identity, run_id


def test_creators_racing_for_the_run_id_agree_on_one(tmp_path: Path) -> None:
    # Threads stand in for the ranks and launches that start together: the exclusive link decides the same way.
    start = threading.Barrier(8)

    def create() -> str:
        start.wait()
        return run_id(tmp_path / "run")

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: create(), range(8)))
    assert len(ids) == 1 and ids == {run_id(tmp_path / "run")}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run_id"]  # no draft left behind


def test_attempts_count_from_the_ledger_and_the_id_is_kept(tmp_path: Path) -> None:
    alone = Peers(0, 1, None)
    first = Identity.establish(tmp_path, alone, scripted=True)
    second = Identity.establish(tmp_path, alone, scripted=True)
    assert (first.attempt, second.attempt) == (1, 2) and first.run_id == second.run_id
    assert second.tag == {"job_id": second.job_id, "restart": 1}
    # Under `legato run` the job side recorded the attempt already; a new `legato run` session counts from 1 again.
    record(tmp_path, Kind.RUN_STARTED, command=[], executor="local", world_size=1, total_steps=1, config_digest="", max_requeues=1)
    record(tmp_path, Kind.ATTEMPT_STARTED, job_id="7", restart=0, executor="local", hosts=[], world_size=1, master_addr="")
    supervised = Identity.establish(tmp_path, alone, scripted=False)
    assert (supervised.attempt, supervised.run_id) == (1, first.run_id)
    assert [e["event"] for e in read_records(tmp_path)].count(Kind.ATTEMPT_STARTED) == 3


def _committed(step: int, reason: str) -> dict:
    return {
        "event": Kind.CHECKPOINT_COMMITTED,
        "rank": 0,
        "step": step,
        "global_hash": f"h{step}",
        "seconds": 0.1,
        "bytes": 1,
        "reason": reason,
    }


def test_status_reads_a_scripts_attempts_from_what_its_recorder_wrote(tmp_path: Path) -> None:
    alone = Peers(0, 1, None)
    first = LedgerRecorder(tmp_path, Identity.establish(tmp_path, alone, scripted=True).tag)
    first({"event": Kind.PROGRESS, "rank": 0, "step": 3, "total_steps": 9, "epoch": 0, "loss": 1.0})
    first({"event": Kind.STOP_AGREED, "rank": 1, "step": 4, "signal_received_at": 5.0})
    first({"event": Kind.STOP_AGREED, "rank": 0, "step": 4, "signal_received_at": None})
    first(_committed(4, "signal"))
    second = LedgerRecorder(tmp_path, Identity.establish(tmp_path, alone, scripted=True).tag)
    second(
        {
            "event": Kind.RESUMED,
            "rank": 0,
            "step": 4,
            "path": "x",
            "expected_hash": "h4",
            "recomputed_hash": "h4",
            "match": True,
            "mismatches": {},
            "replay": None,
        }
    )
    second(_committed(8, "periodic"))
    third = LedgerRecorder(tmp_path, Identity.establish(tmp_path, alone, scripted=True).tag)  # the second was killed
    third(_committed(9, "final"))
    summary = summarize(tmp_path, read_records(tmp_path))
    assert [(a.ended, a.resumed_from_step, a.stop_signal_step) for a in summary.attempts] == [
        ("stopped", None, 4),
        ("ended, killed", 4, None),
        ("finished", None, None),
    ]
    assert summary.state == Kind.FINISHED and summary.final_global_hash == "h9" and summary.step == 9
    assert (tmp_path / "progress.json").is_file()


def test_watch_follows_a_running_scripts_run_until_it_finishes(tmp_path: Path) -> None:
    alone = Peers(0, 1, None)
    recorder = LedgerRecorder(tmp_path, Identity.establish(tmp_path, alone, scripted=True).tag)
    recorder(_committed(4, "periodic"))
    shown: list = []
    out = io.StringIO()
    finisher = threading.Timer(1.5, recorder, args=(_committed(9, "final"),))
    finisher.start()
    try:
        code = watch_script(tmp_path, LiveView(stream=out), shown.append)
    finally:
        finisher.cancel()
    assert code == 0 and [s.state for s in shown] == ["running", Kind.FINISHED]
    assert "training complete at step 9" in out.getvalue()


def test_a_finished_run_launched_again_trains_nothing_and_its_attempt_ends_finished(tmp_path: Path, caplog) -> None:
    """A requeue after the end, a rerun of the same command, or a shorter total_steps: the attempt resumes the final
    checkpoint, trains nothing, leaves the checkpoints and trajectory as they were, and says it finished. It used to
    record no end at all: `legato status` showed it running for ever, and as killed once another attempt began."""
    import torch

    import legato

    def launch(total_steps: int) -> legato.Session:
        model = torch.nn.Linear(2, 1)
        session = legato.Session(
            tmp_path,
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            total_steps=total_steps,
            checkpoint=legato.CheckpointPolicy(replay_steps=0),
        )
        for step in session:
            session.report(fit_step(model, session.optimizer, torch.full((1, 2), float(step)), torch.ones(1, 1)))
        assert session.exit_code == 0
        return session

    caplog.set_level(logging.INFO)  # rank 0's voice then logs, where the test reads it
    launch(4)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir()), (tmp_path / "trajectory" / "rank0.jsonl").read_bytes()
    for total in (4, 3):
        assert launch(total).step == 4
        assert f"the run is already complete at step 4 (total_steps={total}); nothing to train" in caplog.text
        caplog.clear()
    assert (sorted(p.name for p in (tmp_path / "checkpoints").iterdir()), (tmp_path / "trajectory" / "rank0.jsonl").read_bytes()) == before
    summary = summarize(tmp_path, read_records(tmp_path))
    assert [a.ended for a in summary.attempts] == ["finished"] * 3
    finals = [e["final_global_hash"] for e in read_records(tmp_path) if e["event"] == Kind.FINISHED]
    assert len(finals) == 3 and len(set(finals)) == 1 and summary.final_global_hash == finals[0]


def test_another_model_in_the_same_run_directory_is_named_and_its_checkpoints_are_left_as_they_were(tmp_path: Path) -> None:
    """A new experiment started in an old run directory: the checkpoint's model does not load into this one. It used to
    be torch's bare RuntimeError from deep in the resume; it is one paragraph naming the checkpoint and the way out."""
    import torch

    import legato

    def launch(model: torch.nn.Module) -> None:
        session = legato.Session(
            tmp_path,
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            total_steps=3,
            checkpoint=legato.CheckpointPolicy(replay_steps=0),
        )
        for _ in session:
            session.report(fit_step(model, session.optimizer, torch.ones(1, 2), torch.ones(1, 1)))

    launch(torch.nn.Linear(2, 1))
    before = files_under(tmp_path / "checkpoints")
    with pytest.raises(legato.UsageError) as refused:
        launch(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)))
    said = str(refused.value)
    checkpoint = tmp_path / "checkpoints" / "step_3"
    assert said.startswith(f"Checkpoint {checkpoint} does not fit this run's model (Sequential): RuntimeError:"), said
    assert 'Missing key(s) in state_dict: "0.weight"' in said and "start this one in a new run directory" in said and "\n" not in said
    assert files_under(tmp_path / "checkpoints") == before


def test_another_batch_size_on_resume_is_named_not_left_to_a_verification_that_blames_an_rng(tmp_path: Path) -> None:
    """Batch 4 for 10 steps, then the same script with batch 8: the checkpoint's 40 samples are step 5 of the new loader, not
    step 10. The counters differed and the resume failed naming an RNG drawn after the restore as the usual cause."""
    import torch

    import legato

    dataset = torch.utils.data.TensorDataset(torch.arange(128.0).reshape(64, 2), torch.zeros(64, 1))

    def launch(batch_size: int, total_steps: int) -> legato.Session:
        return fit_run(tmp_path, legato.resumable_loader(dataset, batch_size=batch_size, seed=1), total_steps, features=2)

    launch(4, 10)
    with pytest.raises(legato.UsageError) as refused:
        launch(8, 20)
    said = str(refused.value)
    assert "stopped at step 10 of its epoch, but with this run's loader its data position is step 5" in said, said
    assert "the global batch (per-rank batch x ranks) or the dataset changed" in said
    assert launch(4, 20).step == 20  # the refused attempt harmed nothing: the run goes on with its own loader


def test_another_optimizer_class_that_loads_without_an_error_is_named_as_the_likely_cause(tmp_path: Path) -> None:
    """AdamW loads SGD's state dict without a word; the restored state then differs from the checkpoint's. The paragraph
    names the optimizer as not what wrote it, not a generator drawn after the restore (the cause it used to suggest)."""
    import torch

    import legato

    def launch(make: type) -> None:
        model = torch.nn.Linear(2, 1)
        session = legato.Session(
            tmp_path,
            model=model,
            optimizer=make(model.parameters(), lr=0.1),
            total_steps=3,
            checkpoint=legato.CheckpointPolicy(replay_steps=0),
        )
        for _ in session:
            session.report(fit_step(model, session.optimizer, torch.ones(1, 2), torch.ones(1, 1)))

    launch(torch.optim.SGD)
    with pytest.raises(legato.ResumeMismatchError) as refused:
        launch(torch.optim.AdamW)
    said = str(refused.value)
    assert "Differing components: rank 0: optimizer. This run's optimizer is not what wrote the checkpoint" in said, said
    assert "generator" not in said


def _fit(tmp_path: Path, total_steps: int, every_steps: int = 0, dataset: object = None) -> tuple:
    """A script's Session over a small loader (or none), one rank, and its model; the caller iterates it."""
    import torch

    import legato

    model = torch.nn.Linear(2, 1)
    loader = None if dataset is None else torch.utils.data.DataLoader(dataset, batch_size=2)
    policy = legato.CheckpointPolicy(replay_steps=0, every_steps=every_steps)
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loader=loader,
        total_steps=total_steps,
        checkpoint=policy,
    )
    return session, model


def test_a_loop_left_with_break_is_recorded_and_status_says_where_the_next_launch_resumes(tmp_path: Path) -> None:
    """Early stopping: the script breaks out of the loop at step 5 of 9. It used to record nothing: `legato status` showed
    the run running for ever at its last progress reading. Now the attempt ends "left the loop" at step 5, and the
    reason names the checkpoint (step 4) that the next launch resumes from."""
    import torch

    session, model = _fit(tmp_path, total_steps=9, every_steps=4)
    for _ in session:
        session.report(fit_step(model, session.optimizer, torch.ones(1, 2), torch.ones(1, 1)))
        if session.step == 5:
            break
    left = [e for e in read_records(tmp_path) if e["event"] == Kind.LOOP_LEFT]
    assert [(e["step"], e["total_steps"], e["checkpoint_step"], e["exception"]) for e in left] == [(5, 9, 4, None)]
    summary = summarize(tmp_path, read_records(tmp_path))
    assert (summary.state, summary.step, [a.ended for a in summary.attempts]) == ("ended early", 5, ["left the loop"])
    assert "after step 5 of 9" in summary.failure and "since the checkpoint at step 4 are not saved" in summary.failure
    assert watch_script(tmp_path, LiveView(stream=io.StringIO()), [].append) == 0  # the run ended: watch does not wait for ever
    assert "the script left the loop after step 5 of 9" in LiveView(stream=io.StringIO()).event_line(left[0])


def test_an_exception_out_of_the_loaders_step_fails_the_run_and_names_the_original_error(tmp_path: Path) -> None:
    """A corrupt sample raises inside the loader, so out of the Session's own step: the run is recorded failed, with the
    error's type and message in one line, and the attempt's row names the type."""
    import torch

    class Corrupt(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if i == 5:
                raise ValueError(f"corrupt sample {i}\nsecond line of the message")
            return torch.ones(2), torch.ones(1)

    session, model = _fit(tmp_path, total_steps=4, dataset=Corrupt())
    with pytest.raises(ValueError, match="corrupt sample 5"):
        for x, y in session:
            session.report(fit_step(model, session.optimizer, x, y))
    summary = summarize(tmp_path, read_records(tmp_path))
    assert (summary.state, summary.step, [a.ended for a in summary.attempts]) == ("failed", 2, ["raised ValueError"])
    assert summary.failure.startswith("the script raised ValueError: corrupt sample 5 ... second line of the message after step 2;")
    assert "since the start are not saved" in summary.failure
    assert watch_script(tmp_path, LiveView(stream=io.StringIO()), [].append) == 1


def test_a_session_iterated_again_after_its_loop_is_refused_not_reopened(tmp_path: Path) -> None:
    """A second `for ... in session` used to open a second attempt in the same process: it resumed the run's own final
    checkpoint and rewrote the first attempt's row in `legato status` as 0 steps resumed at the end."""
    import torch

    import legato

    session, model = _fit(tmp_path, total_steps=3)
    for _ in session:
        session.report(fit_step(model, session.optimizer, torch.ones(1, 2), torch.ones(1, 1)))
    before = read_records(tmp_path)
    with pytest.raises(legato.UsageError, match=r"loop already ran \(it ended at step 3\).*make a new Session"):
        next(iter(session))
    with pytest.raises(legato.UsageError, match="loop already ran"):
        next(iter(session.epochs()))
    assert read_records(tmp_path) == before
    assert [a.steps_run for a in summarize(tmp_path, before).attempts] == [3]


@pytest.mark.parametrize("when", ["after an agreed stop", "after the last step"])
def test_a_break_that_follows_the_plan_records_no_early_exit(tmp_path: Path, when: str) -> None:
    """`if session.stopped: break` after an epoch's batches once the ranks agreed to stop, and a break once the last
    step is done, are how epoch loops end: the attempt ends stopped or finished, as before, with no LOOP_LEFT. (In-process,
    the stop planted by chaos: a logic test only; test_trackers.py stops such a loop with a real signal from outside.)"""
    import torch

    import legato

    model = torch.nn.Linear(2, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2), torch.ones(8, 1)), batch_size=2)
    chaos = legato.Chaos(signal_rank=0, signal_at_steps=(2,)) if when == "after an agreed stop" else None
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loader=loader,
        total_epochs=2,
        checkpoint=legato.CheckpointPolicy(replay_steps=0, agree_every_steps=1),
        chaos=chaos,
    )
    for _ in session.epochs():
        for x, y in session.batches():
            session.report(fit_step(model, session.optimizer, x, y))
        if session.stopped or session.step == session.total_steps:
            break
    # The environment capture records itself whenever its own process is done: not part of the loop's order.
    kinds = [e["event"] for e in read_records(tmp_path) if e["event"] not in (Kind.REPRO_CAPTURED, Kind.REPRO_FAILED)]
    assert Kind.LOOP_LEFT not in kinds
    assert kinds[-1] == (Kind.ATTEMPT_STOPPED if when == "after an agreed stop" else Kind.FINISHED), kinds
