"""A loop in the style of timm's train.py, ported as a new user would and as the docs say, with 2 real ranks and real stops.

tests/helpers/timm_loop.py: a scheduler that keeps each rank's own loss average (`step_update(n, metric=losses_m.avg)`),
an AverageMeter built inside the epoch function, mixup from numpy's global RNG, an EMA, validation through the DDP
wrapper and a best-checkpoint saver of plain attributes. Stops by real SIGUSR2 land mid-epoch (step 4), at an epoch's
end (step 12) and past a replay base inside an epoch (step 16). Exactness is bits: loss hex per step, digests.

- ported (meter outside the epoch function, meter and saver registered with legato.attributes): uninterrupted and
  stopped, it ends equal to the plain loop, the saver's list and best epoch included;
- naive (the meter inside, the saver unregistered): the census names both; a resume that depends on neither says
  "verified, except 1 unregistered object: losses_m"; the one whose replay base sits inside an epoch is refused
  naming the meter as the cause, and `legato status` says FAILED with it. Before the scheduler was saved per rank,
  every resume of this loop was refused (rank 0's metric restored on every rank).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks

pytestmark = pytest.mark.slow

LOOP = ROOT / "tests" / "helpers" / "timm_loop.py"
STOPS = {"LEGATO_CHAOS_SIGNAL_AT": "3,11,15", "LEGATO_CHAOS_SIGNAL_RANK": "1"}


def launch(run_dir: Path, style: str, **env: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(LOOP), str(run_dir), "--style", style], **env)


def until_done(run_dir: Path, style: str) -> list[list[subprocess.CompletedProcess]]:
    attempts = []
    for _ in range(5):
        attempts.append(launch(run_dir, style, **STOPS))
        if codes(attempts[-1]) != [75, 75]:
            break
    return attempts


def results(run_dir: Path) -> list[dict]:
    return [json.loads((run_dir / f"result_rank{rank}.json").read_text()) for rank in range(2)]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("timm") / "plain"
    assert codes(launch(out, "plain")) == [0, 0]
    return results(out)


def test_the_ported_loop_equals_its_plain_loop_uninterrupted_and_across_stops(tmp_path: Path, plain: list[dict]) -> None:
    assert codes(launch(tmp_path / "uninterrupted", "ported")) == [0, 0]
    assert results(tmp_path / "uninterrupted") == plain
    attempts = until_done(tmp_path / "stopped", "ported")
    assert [codes(a) for a in attempts] == [[75, 75]] * 3 + [[0, 0]], attempts[-1][0].stderr[-3000:]
    resumed = [line for a in attempts for line in a[0].stderr.splitlines() if "resumed at step" in line]
    assert [line.split("resumed at step ")[1].split()[0] for line in resumed] == ["4", "12", "16"]
    assert all("verified by a replay" in line and "except" not in line for line in resumed), resumed
    assert results(tmp_path / "stopped") == plain
    assert plain[0]["saver"][0] and plain[0]["saver"][1] is not None  # the saver's list and best epoch are compared too


def test_the_naive_port_is_named_by_the_census_and_never_claims_what_it_did_not_verify(tmp_path: Path) -> None:
    attempts = until_done(tmp_path, "naive")
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [3, 3]], attempts[-1][0].stderr[-3000:]
    said = "\n".join(a[0].stderr for a in attempts)
    assert "AverageMeter (plain object the loop changes, 4 plain attribute(s)) found as losses_m (local of train_one_epoch()" in said
    assert "CheckpointSaver (plain object the loop changes, 4 plain attribute(s)) found as saver (local of main()" in said
    (resumed,) = [line for line in attempts[1][0].stderr.splitlines() if "resumed at step 4" in line]
    assert "verified by a replay of 4 steps from step 0 in " in resumed and "s, except 1 unregistered object: losses_m" in resumed
    last = attempts[2][0].stderr.strip().splitlines()[-1]
    assert "FAILED: resume not verified" in last and "the census named losses_m" in last and "legato.attributes(obj)" in last
    shown = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", "status", str(tmp_path)], capture_output=True, text=True, timeout=120
    ).stdout
    assert "FAILED, step 12/18" in shown and "✓ except 1" in shown and "the census named losses_m" in shown, shown
    assert "resumes verified, except 2 unregistered objects: losses_m, saver" in shown, shown
    # The saver was found by the census of the stop at step 12, which runs beside its write: the next checkpoints carry it.
    manifest = json.loads((tmp_path / "checkpoints" / "step_12" / "manifest.json").read_text())
    assert manifest["unregistered"] == ["losses_m"]
