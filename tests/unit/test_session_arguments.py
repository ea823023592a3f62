"""A script's arguments to legato (Session, its policies, seed_everything, resumable_loader): one paragraph per mistake.

A file given as the run directory, an optimizer passed as the model or a scheduler given by name used to end in a
FileExistsError or AttributeError from deep inside; `CheckpointPolicy(keep_last=0)` was taken as given: the first
periodic checkpoint pruned itself and the run died with no checkpoint left; `total_steps=0` or `-5` ended at once
with exit 0, as if it had trained. The policy is now checked against the bounds of the config's `checkpoint.*` keys
(legato.config, the one table of them), so the two doors cannot drift apart: one test walks every bounded key and
plants the value just past its bound.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import torch

import legato
from legato.config import CheckpointSection, config_from_dict
from legato.config_build import yaml_key


def _session(run_dir: Path, **kwargs) -> legato.Session:
    model = torch.nn.Linear(2, 1)
    kwargs.setdefault("total_steps", 4)
    return legato.Session(run_dir, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


LENGTHS = [(0, "0"), (-5, "-5"), (2.5, "2.5"), ("100", "'100'"), (True, "True"), (10**10, "10000000000")]


@pytest.mark.parametrize(("value", "shown"), LENGTHS)
def test_a_run_length_that_is_not_a_positive_whole_number_is_refused_before_the_run_directory_exists(
    tmp_path: Path, value: object, shown: str
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(legato.UsageError, match=rf"Session: total_steps={shown} is not a run length\. Pass a positive whole number"):
        _session(run_dir, total_steps=value)
    assert not run_dir.exists()


def test_total_epochs_is_held_to_the_same_rule_and_a_numpy_integer_is_a_whole_number(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, 1)), batch_size=2)
    with pytest.raises(legato.UsageError, match=r"total_epochs=0 is not a run length.*such as total_epochs=90"):
        _session(tmp_path / "epochs", loader=loader, total_steps=None, total_epochs=0)
    assert _session(tmp_path / "numpy", total_steps=np.int64(6)).total_steps == 6
    assert _session(tmp_path / "from_epochs", loader=loader, total_steps=None, total_epochs=np.int32(3)).total_steps == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep_last": 0}, "CheckpointPolicy: keep_last is 0, but it must be positive. Set a value of 1 or more."),
        ({"verify": "eror"}, "CheckpointPolicy: verify is 'eror', which is not one of: error, warn. Pick one of those."),
        ({"replay_steps": -3}, "CheckpointPolicy: replay_steps is -3, but it must be at least 0."),
        ({"every_minutes": -1}, "CheckpointPolicy: every_minutes is -1.0, but it must be at least 0."),
        ({"agree_every_steps": 2.5}, "CheckpointPolicy: agree_every_steps must be an integer, but it is 2.5 (float)."),
        ({"async_": "yes"}, "CheckpointPolicy: async_ must be true or false, but it is 'yes' (str)."),
        ({"replay_seconds": math.nan}, "CheckpointPolicy: replay_seconds is nan; it must be a finite number."),
    ],
)
def test_a_checkpoint_policy_out_of_bounds_is_refused_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(legato.UsageError) as refused:
        legato.CheckpointPolicy(**kwargs)
    assert str(refused.value).startswith(message), str(refused.value)


def test_keep_last_zero_no_longer_reaches_a_run_where_it_pruned_every_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(legato.UsageError, match="keep_last is 0"):
        _session(tmp_path, checkpoint=legato.CheckpointPolicy(keep_last=0, every_steps=2))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("signals", "message"),
    [
        ("USR2", "StopPolicy: signals is 'USR2', but it must be a tuple of one or more signal names"),
        ((), "StopPolicy: signals is (), but it must be a tuple"),
        (("FOO",), "StopPolicy: a name in signals is 'FOO', which is not a signal name"),
        (("USR2", "KILL"), "StopPolicy: a name in signals is 'KILL', which is a signal a stop cannot use"),
    ],
)
def test_a_stop_policy_names_the_signal_it_cannot_use(signals: object, message: str) -> None:
    with pytest.raises(legato.UsageError) as refused:
        legato.StopPolicy(signals=signals)
    assert str(refused.value).startswith(message), str(refused.value)


def test_the_defaults_and_values_at_every_bound_are_accepted() -> None:
    assert legato.CheckpointPolicy() == legato.CheckpointPolicy(every_minutes=10)  # an int where a float goes
    legato.CheckpointPolicy(every_steps=0, every_minutes=0, keep_last=1, replay_steps=0, replay_seconds=0, async_=True, verify="warn")
    assert legato.StopPolicy(signals=("usr2", "SIGTERM")).signals == ("usr2", "SIGTERM")


def test_a_config_and_a_session_get_the_same_checkpoint_defaults() -> None:
    """One definition: a `legato run` config that leaves out its checkpoint section checkpoints as a Session does (every
    10 minutes among the rest); they were two copies, and a config had no periodic checkpoint."""
    section = config_from_dict({"train": {"task": "mlp"}}).checkpoint
    policy = legato.CheckpointPolicy()
    assert dataclasses.asdict(section) == dataclasses.asdict(policy) and policy.every_minutes == 10
    assert isinstance(policy, CheckpointSection)


def test_a_configs_checkpoint_and_hang_sections_become_the_sessions_policies_field_for_field() -> None:
    """`legato run` hands its sections to the Session through `from_section`: every field arrives (each set here away
    from its default, so a field the copy dropped would show its default), and the policy's own bounds hold."""
    cfg = config_from_dict(
        {
            "train": {"task": "mlp"},
            "checkpoint": {"every_steps": 7, "every_minutes": 3, "keep_last": 5, "replay_steps": 8, "hash_every_steps": 2},
            "hang": {"floor_s": 11, "phase_s": 120},
        }
    )
    for section, policy_type in ((cfg.checkpoint, legato.CheckpointPolicy), (cfg.hang, legato.HangPolicy)):
        policy = policy_type.from_section(section)
        assert type(policy) is policy_type and dataclasses.asdict(policy) == dataclasses.asdict(section)
    assert legato.CheckpointPolicy.from_section(cfg.checkpoint).every_steps == 7
    assert legato.HangPolicy.from_section(cfg.hang).floor_s == 11
    with pytest.raises(legato.UsageError, match=r"CheckpointPolicy: keep_last is "):
        legato.CheckpointPolicy.from_section(dataclasses.replace(cfg.checkpoint, keep_last=0))


def test_every_bounded_checkpoint_key_refuses_the_value_just_past_its_bound_through_the_policy_too() -> None:
    """Walks the config's table: a bound added to a `checkpoint.*` key holds for CheckpointPolicy with no second copy."""
    bounded = [f for f in dataclasses.fields(CheckpointSection) if f.metadata["minimum"] is not None]
    assert {yaml_key(f) for f in bounded} >= {"every_steps", "keep_last", "replay_steps", "every_minutes"}
    for f in bounded:
        kind = int if isinstance(f.default, int) and not isinstance(f.default, bool) else float
        below, above = kind(f.metadata["minimum"]) - 1, kind(f.metadata["maximum"]) * 2
        for value in (below, above):
            with pytest.raises(legato.UsageError, match=rf"CheckpointPolicy: {f.name} is "):
                legato.CheckpointPolicy(**{f.name: value})


def test_a_run_dir_that_is_a_file_is_refused_with_the_config_rule_and_the_file_is_left_as_it_was(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    with pytest.raises(legato.UsageError, match=r"Session: run_dir '.*notes.txt' is a file, not a directory\. Pass a directory"):
        _session(afile)
    with pytest.raises(legato.UsageError, match=r"run_dir '.*notes.txt/run' lies under .*notes.txt, which is a file"):
        _session(afile / "run")
    assert afile.read_text() == "keep me"
    with pytest.raises(legato.UsageError, match=r"Session: run_dir '5' is of type int, not a path\."):
        _session(5)
    assert _session(PurePosixPath(tmp_path / "pure")).run_dir == tmp_path / "pure"  # any os.PathLike


@pytest.mark.parametrize(
    ("swap", "message"),
    [
        ("model_is_the_optimizer", "Session: model= is a SGD, not a torch.nn.Module."),
        ("optimizer_is_the_model", "Session: optimizer= is a Linear, not a torch optimizer (it has no param_groups)."),
        ("no_optimizer", "Session: optimizer= is a NoneType, not a torch optimizer"),
        ("scheduler_is_a_name", "Session state 'scheduler' is a str, which has no state_dict()/load_state_dict()."),
    ],
)
def test_an_argument_of_the_wrong_kind_is_named_instead_of_an_attribute_error(tmp_path: Path, swap: str, message: str) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"model": model, "optimizer": optimizer, "total_steps": 4}
    kwargs.update(
        {
            "model_is_the_optimizer": {"model": optimizer},
            "optimizer_is_the_model": {"optimizer": model},
            "no_optimizer": {"optimizer": None},
            "scheduler_is_a_name": {"scheduler": "cosine"},
        }[swap]
    )
    with pytest.raises(legato.UsageError) as refused:
        legato.Session(tmp_path / "run", **kwargs)
    assert str(refused.value).startswith(message), str(refused.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": 1.0}, "seed_everything(seed=1.0, rank=0): the seed is a whole number"),
        ({"seed": "1"}, "seed_everything(seed='1', rank=0): the seed is a whole number"),
        ({"rank": -1}, "seed_everything(seed=7, rank=-1): the seed is a whole number"),
    ],
)
def test_seed_everything_refuses_a_seed_or_rank_that_is_not_a_whole_number(kwargs: dict, message: str) -> None:
    with pytest.raises(legato.UsageError) as refused:
        legato.seed_everything(**{"seed": 7, "rank": 0, "mode": "fast", **kwargs})
    assert str(refused.value).startswith(message), str(refused.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": 5}, "legato.resumable_loader() takes a map-style dataset (len() and indexing), which this int is not."),
        ({"batch_size": 0}, "legato.resumable_loader(): batch_size=0 must be a whole number of at least 1."),
        ({"world_size": 0}, "legato.resumable_loader(): world_size=0 must be a whole number of at least 1."),
        ({"rank": 2, "world_size": 2}, "legato.resumable_loader(): rank=2 is not one of the 2 ranks (0 to 1)."),
        ({"seed": "x"}, "legato.resumable_loader(): seed='x' must be a whole number"),
        ({"world_size": 9}, "legato.resumable_loader(): the dataset's 8 samples cannot be split over 9 ranks."),
    ],
)
def test_resumable_loader_names_the_argument_it_cannot_use(kwargs: dict, message: str) -> None:
    arguments = {"dataset": torch.utils.data.TensorDataset(torch.zeros(8, 2)), "batch_size": 2, "seed": 1, "rank": 0, "world_size": 1}
    arguments.update(kwargs)
    with pytest.raises(legato.UsageError) as refused:
        legato.resumable_loader(arguments.pop("dataset"), **arguments)
    assert str(refused.value).startswith(message), str(refused.value)
    assert len(legato.resumable_loader(torch.utils.data.TensorDataset(torch.zeros(8, 2)), 2, seed=np.int64(1), rank=1, world_size=2)) == 2


@pytest.mark.parametrize(("loss", "shown"), [("abc", "a str"), (None, "a NoneType"), (torch.ones(2, 3), "a tensor of shape (2, 3)")])
def test_report_takes_one_number_and_names_what_it_got(tmp_path: Path, loss: object, shown: str) -> None:
    session = _session(tmp_path, checkpoint=legato.CheckpointPolicy(replay_steps=0))
    held = session.carry(torch.zeros(1))
    for _ in session:
        session.report(torch.ones(1))  # a one-element tensor, a float and a numpy number are one number
        session.report(0.5)
        session.report(np.float32(0.25))
        with pytest.raises(legato.UsageError, match=rf"takes the step's loss as one number .*, not {re.escape(shown)}\. Pass"):
            session.report(loss)
        session.carry(held)
        break


def _train(session: legato.Session) -> int:
    for _ in session:
        loss = session.model(torch.ones(1, 2)).sum()
        loss.backward()
        session.optimizer.step()
        session.optimizer.zero_grad()
        session.report(loss)
    return session.exit_code


def test_legato_resume_required_refuses_a_launch_with_nothing_to_resume_and_resumes_one_with_something(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job script's relaunch says it must resume: a mistyped run directory is refused (exit 2) before anything is written,
    and a real one resumes (one whose checkpoints are all unusable is refused at the pick, whatever LEGATO_RESUME says)."""
    monkeypatch.setenv("LEGATO_RESUME", "required")
    with pytest.raises(legato.UsageError, match=r"LEGATO_RESUME=required, but .*typo/checkpoints holds no checkpoint to resume"):
        _session(tmp_path / "typo")
    assert not (tmp_path / "typo").exists()
    monkeypatch.delenv("LEGATO_RESUME")
    assert _train(_session(tmp_path / "run", total_steps=2)) == legato.EXIT_OK
    monkeypatch.setenv("LEGATO_RESUME", "required")
    resumed = _session(tmp_path / "run", total_steps=3)
    assert _train(resumed) == legato.EXIT_OK and resumed.resumed is not None and resumed.resumed.step == 2
    (tmp_path / "broken" / "checkpoints" / "step_5").mkdir(parents=True)  # a checkpoint directory with no manifest
    with pytest.raises(legato.UsageError, match="so this run cannot resume, and starting over would replace them"):
        _train(_session(tmp_path / "broken"))
    monkeypatch.setenv("LEGATO_RESUME", "always")
    with pytest.raises(legato.UsageError, match="LEGATO_RESUME='always' is not a choice legato knows"):
        _session(tmp_path / "other")
    assert not (tmp_path / "other").exists()
