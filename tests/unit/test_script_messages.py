"""What a user's own script is told: messages that name the API's arguments, a refusal said once by the rank that raised
it and ending an uncaught script with exit 2 (the real scripts: tests/e2e/test_script_verification.py), a failed
verification that exits 3 without a traceback, the likeliest cause for a loop without a loader, and verify's
judgement of a script's unseeded RNGs.

The verify checks read trajectories written here by hand (a fake of what two runs wrote, for the logic only); the
real runs are in tests/e2e/test_verify_command.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import legato
from legato.errors import EXIT_USAGE, UsageError, UsageRefused
from legato.orchestrator.verify import first_divergence, rng_words, unseeded_rngs
from legato.session.replay import RankReport, judge
from legato.state.determinism import seed_everything
from legato.voice import refusals_said_by_caller, refusing

EVERY_ENTRY = {  # the public API's entry points a script calls first, each with an argument it refuses
    "CheckpointPolicy": lambda tmp: legato.CheckpointPolicy(keep_last=0),
    "StopPolicy": lambda tmp: legato.StopPolicy(signals="USR2"),
    "seed_everything": lambda tmp: legato.seed_everything(0, 0, mode="loose"),
    "resumable_loader": lambda tmp: legato.resumable_loader([1, 2], 0, seed=0),
    "Session": lambda tmp: legato.Session(tmp, model=torch.nn.Linear(1, 1), optimizer=None, total_steps=1),
}


@refusing
def inner() -> None:
    raise UsageError("inner: the paragraph.")


@refusing
def outer() -> None:
    inner()


@refusing
def steps(fail: BaseException):
    yield 1
    yield 2
    raise fail


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def test_a_refusal_is_said_once_and_raised_on_as_a_usage_error_that_ends_an_uncaught_script_with_exit_2(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(UsageRefused) as info:
        outer()  # the inner entry said it; the outer one passes it on without a second line
    assert isinstance(info.value, UsageError) and isinstance(info.value, SystemExit) and info.value.code == EXIT_USAGE
    assert str(info.value) == "inner: the paragraph." and type(info.value.__cause__) is UsageError
    assert said(caplog) == ["inner: the paragraph."]


def test_a_generator_entry_yields_as_before_and_says_a_refusal_only(caplog: pytest.LogCaptureFixture) -> None:
    seen = []
    with pytest.raises(UsageRefused):
        for item in steps(UsageError("mid-loop.")):
            seen.append(item)
    assert seen == [1, 2] and said(caplog) == ["mid-loop."]
    with pytest.raises(ValueError):
        list(steps(ValueError("not a usage error")))
    left = steps(UsageError("never reached"))
    assert next(left) == 1
    left.close()  # a `break` out of the loop
    assert said(caplog) == ["mid-loop."]


def test_under_legatos_own_rank_entry_a_refusal_is_left_to_it_unsaid(caplog: pytest.LogCaptureFixture) -> None:
    with refusals_said_by_caller(), pytest.raises(UsageError) as info:  # as runtime.job runs a rank: it says `error: ...`
        outer()
    assert type(info.value) is UsageError and said(caplog) == []
    with pytest.raises(UsageRefused):  # and only within it
        outer()
    assert said(caplog) == ["inner: the paragraph."]


@pytest.mark.parametrize("entry", sorted(EVERY_ENTRY))
def test_every_entry_of_the_public_api_says_its_refusal(entry: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(UsageRefused) as info:
        EVERY_ENTRY[entry](tmp_path / "run")
    assert said(caplog) == [str(info.value)]


def test_arguments_that_do_not_fit_an_entry_are_a_refusal_naming_them_and_other_type_errors_are_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Linear(1, 1)
    with pytest.raises(
        UsageRefused,
        match=r"^Session\(\): missing a required argument: 'optimizer'\. Pass the arguments it takes: "
        r"Session\(run_dir, \*, model, optimizer, loader=\.\.\.",
    ):
        legato.Session(tmp_path / "a", model=model, total_steps=1)
    with pytest.raises(UsageRefused, match=r"^Session\(\): no argument named optimiser \(did you mean optimizer\?\)"):
        legato.Session(tmp_path / "b", model=model, optimiser=torch.optim.SGD(model.parameters(), lr=0.1), total_steps=1)
    with pytest.raises(UsageRefused, match=r"^steps\(\): no argument named failure \(did you mean fail\?\)"):
        list(steps(failure=ValueError()))
    assert len(said(caplog)) == 3 and not (tmp_path / "a").exists()

    @refusing
    def raises_inside(x: int) -> None:
        raise TypeError("a TypeError of the call's own")

    with pytest.raises(TypeError, match="of the call's own") as info:
        raises_inside(1)
    assert not isinstance(info.value, UsageError) and len(said(caplog)) == 3


def test_strict_seeding_without_a_hash_seed_names_the_argument_not_a_config_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(UsageError) as info:
        seed_everything(0, 0, mode="strict")
    message = str(info.value)
    assert 'seed_everything(mode="strict") needs PYTHONHASHSEED' in message and 'mode="fast"' in message
    assert "python -m legato.torchrun" in message and "determinism.mode" not in message
    with pytest.raises(UsageError, match=r"seed_everything\(mode='loose'\)"):
        seed_everything(0, 0, mode="loose")


def test_a_replay_divergence_in_a_loop_without_a_loader_names_an_uncarried_batch_first() -> None:
    report = RankReport(rank=1, loss_step=9, loss_bits=("0x1p+0", "0x1.8p+0"))
    without = judge(8, 14, [RankReport(rank=0), report], loader=False).first_divergence
    assert without is not None and without["cause"].startswith("a batch drawn before the stop and not carried")
    assert "session.carry()" in without["cause"]
    with_loader = judge(8, 14, [RankReport(rank=0), report], loader=True).first_divergence
    assert with_loader is not None and "torch.Generator" in with_loader["cause"] and "carried" not in with_loader["cause"]


def _trajectory(run: Path, rows: list[dict]) -> Path:
    (run / "trajectory").mkdir(parents=True)
    (run / "trajectory" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _rows(loss2: str = "0x1.8p+0", model: str = "m", python: str = "p") -> list[dict]:
    components = {"model": model, "rng.python": python, "rng.torch": "t"}
    return [{"step": 1, "loss_hex": "0x1p+0"}, {"step": 2, "loss_hex": loss2, "state_hash": f"{model}{python}", "components": components}]


def test_unseeded_rngs_are_only_rng_components_that_differ_while_everything_else_agrees(tmp_path: Path) -> None:
    reference = _trajectory(tmp_path / "reference", _rows())
    assert unseeded_rngs(reference, _trajectory(tmp_path / "same", _rows()), 1) == []
    again = _trajectory(tmp_path / "again", _rows(python="other"))
    assert unseeded_rngs(reference, again, 1) == ["rng.python"]
    # The planted faults: training drew from the unseeded RNG (a loss bit differs), or another component differs.
    assert unseeded_rngs(reference, _trajectory(tmp_path / "loss", _rows(loss2="0x1.9p+0", python="other")), 1) is None
    assert unseeded_rngs(reference, _trajectory(tmp_path / "model", _rows(model="n", python="other")), 1) is None
    # Left out of the comparison, the RNG hides nothing else: a model that differs too is still the divergence.
    assert first_divergence(reference, again, 1, ["rng.python"]) is None
    both = first_divergence(reference, _trajectory(tmp_path / "both", _rows(model="n", python="other")), 1, ["rng.python"])
    assert both is not None and both.step == 2 and both.components == ["model"]
    assert rng_words(["rng.numpy", "rng.python"]) == "python's and numpy's RNG states (rng.python, rng.numpy)"
