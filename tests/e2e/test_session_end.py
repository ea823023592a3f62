"""A Session ends the control group it made with its loop, so no gloo thread of legato's outlives the loop into the
interpreter's shutdown, where one that touches a Python object aborts the rank ("terminate called without an
active exception") and the launcher counts a clean stop as a failure. A group the script keeps past the loop is
waited for at exit: a rank whose gloo worker still holds its last work and waits for the GIL as the script ends
exits with its code, and without that wait the same ending aborts, every time."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from helpers.launches import ROOT, catches_usr2, reaped, start_ranks, steps_done

SCRIPT = ROOT / "tests" / "helpers" / "session_end.py"
RACE = ROOT / "tests" / "helpers" / "exit_race.py"


def counts(out: Path, world: int) -> list[dict[str, int]]:
    return [json.loads((out / f"threads_rank{rank}.json").read_text()) for rank in range(world)]


def test_a_finished_loop_leaves_only_the_scripts_own_gloo_threads(tmp_path: Path) -> None:
    with reaped(start_ranks(SCRIPT, tmp_path, 2)) as procs:
        assert [p.wait(timeout=300) for p in procs] == [0, 0], (tmp_path / "rank0.stderr").read_text()[-3000:]
    for seen in counts(tmp_path, 2):
        # The count sees a group's threads: the control group's are there during the loop.
        assert seen["during"] > seen["before"] > 0, seen
        assert seen["after"] == seen["before"], seen


def test_a_loop_stopped_by_a_signal_from_outside_ends_its_group_too(tmp_path: Path) -> None:
    with reaped(start_ranks(SCRIPT, tmp_path, 2, STEPS="400", LEGATO_CHAOS_STEP_SLEEP_S="0.05")) as procs:
        deadline = time.monotonic() + 240
        while not (all(catches_usr2(p.pid) for p in procs) and steps_done(tmp_path) >= 3):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the ranks never trained"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGUSR2)
        assert [p.wait(timeout=300) for p in procs] == [75, 75], (tmp_path / "rank0.stderr").read_text()[-3000:]
    for seen in counts(tmp_path, 2):
        assert seen["during"] > seen["before"] > 0, seen
        assert seen["after"] == seen["before"], seen


def race(out: Path, **env: str) -> tuple[list[int], str]:
    """Run tests/helpers/exit_race.py as a two-rank world; the ranks' exit codes and rank 0's stderr. Started cold: the
    interpreter's own exit is what is tested, and a warm rank ends without it (helpers/warm.py)."""
    with reaped(start_ranks(RACE, out, 2, LEGATO_TEST_WARM="0", **env)) as procs:
        codes = [p.wait(timeout=300) for p in procs]
    return codes, (out / "rank0.stderr").read_text()


def test_a_rank_whose_gloo_worker_wants_the_gil_as_it_ends_still_exits_with_its_code(tmp_path: Path) -> None:
    for attempt in range(2):
        codes, stderr = race(tmp_path / f"settled{attempt}")
        assert codes == [0, 0] and "terminate called" not in stderr, stderr[-3000:]
        assert (tmp_path / f"settled{attempt}" / "settle_registered").read_text() == "True"
    # The planted fault: the same ending without the wait at exit aborts, every time.
    for attempt in range(2):
        codes, stderr = race(tmp_path / f"unsettled{attempt}", UNSETTLED="1")
        assert codes[0] < 0 and "terminate called without an active exception" in stderr, (codes, stderr[-3000:])
