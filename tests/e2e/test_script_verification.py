"""A user's own script, as an API user meets legato: strict seeding under legato's launcher, an argument legato refuses
ending the script with exit 2 and one paragraph, and a resume that does not verify ending every rank with exit 3 and one
paragraph that names the likeliest cause for the loop's kind.

The planted fault is the classic one of a loop without a loader: the ported nanoGPT loop (examples/port) with its
`session.carry(...)` calls taken out, so the batch it prefetches into the next step is not in the checkpoint. A replay
from step 0 would hide it (the loop draws its first batch again before the loop, as the first attempt did), so the
copy keeps a replay base every 4 steps: the resume after a stop at step 8 replays from step 4 with the stale first
batch. Ranks run as real processes (RANK, WORLD_SIZE set), so each one's exit code and stderr are seen.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_ranks
from helpers.port import PORT

from legato.errors import ResumeMismatchError
from legato.runtime.launch import free_port

CARRY = 'session.carry(get_batch("train"))'
SESSION_END = "total_steps=max_iters + 1)"

STRICT = """
import os, sys
import legato
seeds = legato.seed_everything(7, int(os.environ["RANK"]), mode="strict")
print("seeded", seeds.rank, seeds.pythonhashseed, flush=True)
"""


def test_strict_seeding_works_under_legato_torchrun_and_an_unset_hash_seed_names_the_argument(tmp_path: Path) -> None:
    script = tmp_path / "seed.py"
    script.write_text(STRICT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato.torchrun",
            "--max-restarts",
            "0",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("seeded")) == ["seeded 0 0", "seeded 1 0"]
    plain = subprocess.run([sys.executable, str(script)], env=dict(env, RANK="0"), capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr[-3000:]
    assert 'seed_everything(mode="strict") needs PYTHONHASHSEED' in plain.stderr and 'mode="fast"' in plain.stderr
    assert "determinism.mode" not in plain.stderr


REFUSED = """
import os, sys, torch, legato
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = legato.resumable_loader(torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), 8, seed=0)
if os.environ.get("CAUGHT"):
    try:
        legato.CheckpointPolicy(keep_last=0)
    except legato.UsageError:
        print("caught", flush=True)
if os.environ.get("PLANT"):  # planted fault: the script raises legato's error itself, past the API that says it
    raise legato.UsageError("CheckpointPolicy: keep_last is 0, planted.")
session = legato.Session(sys.argv[1], model=model, optimizer=optimizer, loader=loader, total_steps=4,
                         checkpoint=legato.CheckpointPolicy(keep_last=0))
"""
PARAGRAPH = "CheckpointPolicy: keep_last is 0, but it must be positive. Set a value of 1 or more."


def test_a_refused_argument_ends_a_script_with_exit_2_and_one_paragraph_plainly_and_under_legato_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "refused.py"
    script.write_text(REFUSED)
    plain = subprocess.run([sys.executable, str(script), str(tmp_path / "plain")], capture_output=True, text=True, timeout=120)
    assert (plain.returncode, plain.stderr) == (2, f"legato: {PARAGRAPH}\n")
    caught = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "caught")],
        env=dict(os.environ, CAUGHT="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert caught.returncode == 2 and caught.stdout == "caught\n" and caught.stderr.count(PARAGRAPH) == 2, caught.stderr
    planted = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "planted")],
        env=dict(os.environ, PLANT="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert planted.returncode == 1 and "Traceback" in planted.stderr, planted.stderr[-3000:]

    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato.torchrun",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(script),
            str(tmp_path / "launched"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert launched.returncode == 2, launched.stderr[-3000:]
    assert "Traceback" not in launched.stderr and "ChildFailedError" not in launched.stderr, launched.stderr[-3000:]
    said = [line for line in launched.stderr.splitlines() if line.startswith("legato: ")]
    assert sorted(said[:-1]) == [f"legato: {PARAGRAPH}", f"legato: rank 1: {PARAGRAPH}"], said  # each rank, once
    assert said[-1].startswith("legato: the script was refused what it was given") and "(exit 2)" in said[-1], said
    assert not (tmp_path / "plain").exists() and not (tmp_path / "launched").exists()


def test_an_uncaught_resume_mismatch_exits_3_without_a_traceback_and_can_still_be_caught() -> None:
    with pytest.raises(ResumeMismatchError):
        try:
            raise ResumeMismatchError("planted")
        except ValueError:
            pytest.fail("not a ValueError")
    code = (
        "from legato.errors import ResumeMismatchError\ntry:\n    raise ResumeMismatchError('x')\nexcept Exception:\n    pass\n"
        "raise ResumeMismatchError('the paragraph')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stderr == "", done.stderr


@pytest.mark.slow
def test_a_batch_not_carried_fails_the_resume_with_exit_3_on_every_rank_and_one_paragraph_naming_carry(tmp_path: Path) -> None:
    source = (PORT / "nanogpt_legato.py").read_text()
    assert source.count(CARRY) == 2
    script = tmp_path / "nanogpt_uncarried.py"
    assert source.count(SESSION_END) == 1
    script.write_text(
        source.replace(CARRY, 'get_batch("train")').replace(
            SESSION_END, "total_steps=max_iters + 1, checkpoint=legato.CheckpointPolicy(replay_steps=4, replay_cost=0))"
        )
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def attempt() -> list[subprocess.CompletedProcess]:
        return run_ranks([sys.executable, str(script), str(run_dir)], LEGATO_CHAOS_SIGNAL_AT="7", LEGATO_CHAOS_SIGNAL_RANK="1")

    first = attempt()
    assert [p.returncode for p in first] == [75, 75], first[0].stderr[-3000:]
    resumed = attempt()
    assert [p.returncode for p in resumed] == [3, 3], resumed[0].stderr[-3000:] + resumed[1].stderr[-3000:]
    for proc in resumed:
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    paragraph = [line for line in resumed[0].stderr.splitlines() if "Resume verification failed" in line]
    assert len(paragraph) == 1 and "Resume verification failed" not in resumed[1].stderr, resumed[0].stderr[-3000:]
    text = paragraph[0]
    assert "a batch drawn before the stop and not carried" in text and "session.carry()" in text, text
    assert text.index("not carried") < text.index("torch.Generator"), text
    assert "Every rank exits 3." in text

    launcher = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato.torchrun",
            "--max-restarts",
            "0",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(script),
            str(run_dir),
        ],
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert launcher.returncode == 3, launcher.stderr[-3000:]
    assert "the resume did not verify, see the paragraph above (exit 3)" in launcher.stderr and "Traceback" not in launcher.stderr
