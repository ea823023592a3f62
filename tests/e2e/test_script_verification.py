"""A user's own script, as an API user meets legato: strict seeding under legato's launcher, and a resume that does not
verify ending every rank with exit 3 and one paragraph that names the likeliest cause for the loop's kind.

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
    done = subprocess.run([sys.executable, "-m", "legato.torchrun", "--max-restarts", "0", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("seeded")) == ["seeded 0 0", "seeded 1 0"]
    plain = subprocess.run([sys.executable, str(script)], env=dict(env, RANK="0"), capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0
    assert 'seed_everything(mode="strict") needs PYTHONHASHSEED' in plain.stderr and 'mode="fast"' in plain.stderr
    assert "determinism.mode" not in plain.stderr


def test_an_uncaught_resume_mismatch_exits_3_without_a_traceback_and_can_still_be_caught() -> None:
    with pytest.raises(ResumeMismatchError):
        try:
            raise ResumeMismatchError("planted")
        except ValueError:
            pytest.fail("not a ValueError")
    code = "from legato.errors import ResumeMismatchError\ntry:\n    raise ResumeMismatchError('x')\nexcept Exception:\n    pass\n" \
           "raise ResumeMismatchError('the paragraph')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stderr == "", done.stderr


@pytest.mark.slow
def test_a_batch_not_carried_fails_the_resume_with_exit_3_on_every_rank_and_one_paragraph_naming_carry(tmp_path: Path) -> None:
    source = (PORT / "nanogpt_legato.py").read_text()
    assert source.count(CARRY) == 2
    script = tmp_path / "nanogpt_uncarried.py"
    assert source.count(SESSION_END) == 1
    script.write_text(source.replace(CARRY, 'get_batch("train")').replace(
        SESSION_END, "total_steps=max_iters + 1, checkpoint=legato.CheckpointPolicy(replay_steps=4))"))
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

    launcher = subprocess.run([sys.executable, "-m", "legato.torchrun", "--max-restarts", "0", "--nproc-per-node", "2", "--master-port",
                               str(free_port()), str(script), str(run_dir)], env=dict(os.environ, PYTHONWARNINGS="ignore"),
                              capture_output=True, text=True, timeout=300)
    assert launcher.returncode == 3, launcher.stderr[-3000:]
    assert "the resume did not verify, see the paragraph above (exit 3)" in launcher.stderr and "Traceback" not in launcher.stderr
