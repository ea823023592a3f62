"""Ported public training loops (examples/port/): few changed lines, the plain loop's bits, exact resume after real signals.

Each pair is a plain DDP loop in the style of a public example and its port to
legato. Two real ranks (gloo, CPU) each time. Three proofs per pair: the port
changes at most 10 lines of code; an uninterrupted port is bit for bit the
plain loop (losses, parameters); and a port stopped by 2 real SIGUSR2 (planted
through LEGATO_CHAOS_SIGNAL_AT, sent by the rank to itself after those steps)
and relaunched after each stop ends bit for bit where an uninterrupted port
ends, each resume verified. The scripts configure no logging: what a person
sees comes from rank 0's own voice on stderr.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from conftest import codes
from helpers.port import PORT, UNSEEDED, assert_same_run, launch, plain_finished, result

pytestmark = pytest.mark.slow

# The tutorial draws a batch each epoch only to print its size; the port reads it from the loader (see README).
TUTORIAL_B_SZ = ("len(next(iter(self.train_data))[0])", "self.train_data.batch_size")


def changed_lines(plain: Path, ported: Path) -> int:
    """Lines of code changed by the port (the module docstrings, which describe each file, left out)."""

    def code(path: Path) -> list[str]:
        text = path.read_text()
        body = text.split('"""', 2)[2]
        return [line for line in body.splitlines() if line.strip()]

    a, b = code(plain), code(ported)
    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def run_port(
    name: str,
    tmp_path: Path,
    signal_at: str,
    resumed_at: list[int],
    steps: int,
    plain_edit: tuple[str, str] | None = None,
    equal_args: tuple[str, ...] = (),
    attempt_args: tuple[tuple[str, ...], ...] = ((), (), ()),
    unseeded: tuple[str, ...] = (),
) -> None:
    """`equal_args` for the plain-vs-port runs, `attempt_args` for each of the 3 attempts of the resumed run
    (its reference takes the first)."""
    plain, ported = PORT / f"{name}_plain.py", PORT / f"{name}_legato.py"
    # 10 lines; the ImageNet port adds the epoch-body stop check (`if session.stopped: break`, 2 lines) and has 9 without it.
    assert changed_lines(plain, ported) <= (11 if name == "imagenet" else 10)
    if plain_edit is not None:
        edited = tmp_path / plain.name
        edited.write_text(plain.read_text().replace(*plain_edit))
        plain = edited
    problem = plain_finished(launch(plain, tmp_path / "plain", *equal_args), tmp_path / "plain")
    assert problem is None, problem
    same = launch(ported, tmp_path / "same", *equal_args)
    assert codes(same) == [0, 0], same[0].stderr[-3000:]
    for rank in range(2):
        assert result(tmp_path / "same", rank) == result(tmp_path / "plain", rank)

    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    if attempt_args[0] != equal_args:
        assert codes(launch(ported, reference, *attempt_args[0])) == [0, 0]
    else:
        reference = tmp_path / "same"
    attempts = [launch(ported, resumed, *args, LEGATO_CHAOS_SIGNAL_AT=signal_at, LEGATO_CHAOS_SIGNAL_RANK="1") for args in attempt_args]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    for later, step in zip(attempts[1:], resumed_at):
        voice = [line for line in later[0].stderr.splitlines() if line.startswith("legato: rank 0: resumed at step")]
        assert len(voice) == 1 and voice[0].startswith(f"legato: rank 0: resumed at step {step} ") and "verified" in voice[0], later[
            0
        ].stderr[-3000:]
        assert "legato:" not in later[1].stderr
    assert_same_run(reference, resumed, steps, unseeded)
    for rank in range(2):
        assert result(resumed, rank)["params"] == result(reference, rank)["params"]


def test_nanogpt_style_loop_without_a_loader(tmp_path: Path) -> None:
    """Batches from get_batch() and the global RNG, one prefetched into the next step with session.carry()."""
    run_port("nanogpt", tmp_path, "7,16", [8, 17], 25, unseeded=UNSEEDED)


def test_ddp_tutorial_trainer_with_its_own_distributed_sampler(tmp_path: Path) -> None:
    """The user's DataLoader(sampler=DistributedSampler), epochs and batches; stops mid-epoch and at an epoch's end (16 steps each)."""
    run_port("ddp_tutorial", tmp_path, "5,31", [6, 32], 48, TUTORIAL_B_SZ, unseeded=UNSEEDED)


def test_imagenet_style_epochs_with_worker_augmentation_validation_and_step_lr(tmp_path: Path) -> None:
    """Augmentation from the global RNGs in 2 workers, resumed mid-epoch and at an epoch's end (8 steps each), last attempt with 1 worker.

    Without workers the port is bit for bit the plain loop; with them, each sample's augmentation is seeded from
    (seed, epoch, index), which is what makes it independent of where the run was cut and of the worker count.
    """
    run_port("imagenet", tmp_path, "2,7", [3, 8], 24, equal_args=("0",), attempt_args=(("2",), ("2",), ("1",)))
