"""The hang watchdog's parts on their own: its settings and their refusals, the bound it derives from step times
(a fake clock, for the arithmetic only; tests/e2e/test_hangs.py plants real hangs), which rank a record names, and
the stacks of another process, asked from outside while it is stopped (a real forked process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from legato.config import config_from_dict
from legato.errors import UsageError
from legato.events import hang_label, repeated_hang_reason
from legato.session import watchdog as wd
from legato.session.policy import HangPolicy
from legato.system import stacks


def test_the_environment_overrides_the_scripts_policy_and_off_turns_it_off() -> None:
    base = HangPolicy(floor_s=60)
    assert base.from_env({}) is base
    assert base.from_env({"LEGATO_HANG": "off"}).watchdog is False
    tuned = base.from_env({"LEGATO_HANG": "floor_s=5, phase_s=30"})
    assert (tuned.floor_s, tuned.phase_s, tuned.step_factor, tuned.watchdog) == (5.0, 30.0, 20.0, True)


@pytest.mark.parametrize(
    ("text", "needle"),
    [("floor=5", "is not one of the hang settings"), ("floor_s", "as key=value"), ("floor_s=0", "floor_s"), ("phase_s=soon", "phase_s")],
)
def test_a_bad_legato_hang_is_refused_in_one_paragraph(text: str, needle: str) -> None:
    with pytest.raises(UsageError) as refused:
        HangPolicy().from_env({"LEGATO_HANG": text})
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_the_config_has_a_hang_section_held_to_its_bounds() -> None:
    assert config_from_dict({"hang": {"floor_s": 30}}).hang.floor_s == 30
    with pytest.raises(UsageError, match="floor_s"):
        config_from_dict({"hang": {"floor_s": 0}})
    with pytest.raises(UsageError, match="watchdog"):
        HangPolicy(watchdog="yes")  # type: ignore[arg-type]


class Clock:
    """A fake monotonic clock (the bound's arithmetic only)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bound_is_the_floor_or_a_multiple_of_the_slowest_step_and_longer_outside_steps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = Clock()
    monkeypatch.setattr(wd.time, "monotonic", clock)
    dog = wd.Watchdog(HangPolicy(floor_s=10, step_factor=20, phase_s=300), 0, [], tmp_path, "script", 1, lambda e: None)
    assert dog.bound_s(wd.START_UP) == 300
    dog.beat(wd.STEP)
    clock.now += 0.1
    dog.stepped(1)
    assert dog.bound_s(wd.STEP) == 10  # 20 x 0.1 s is under the floor
    clock.now += 2.0
    dog.stepped(2)
    assert dog.bound_s(wd.STEP) == 40  # 20 x the slowest step
    dog.beat(wd.EPOCH_END)
    clock.now += 50.0  # a validation after the epoch: not a step, so it does not raise the bound
    dog.stepped(3)
    assert dog.bound_s(wd.STEP) == 40 and dog.bound_s(wd.CHECKPOINT) == 300


def test_the_record_names_the_rank_stuck_in_its_own_code_not_the_ones_waiting_for_it() -> None:
    waiting = {"rank": 1, "host": "a", "step": 7, "frame": "torch/autograd/graph.py:9 in run", "user_frame": "train.py:56 in main"}
    stuck = {"rank": 0, "host": "a", "step": 7, "frame": "train.py:36 in load", "user_frame": "train.py:36 in load"}
    assert wd._culprit(waiting, [waiting, stuck])["rank"] == 0
    assert wd._culprit(waiting, [waiting])["rank"] == 1  # nobody in their own code: the recording rank


def test_a_rank_of_another_host_that_never_answered_is_silent_unless_its_own_host_found_it_stopped() -> None:
    peers = [wd.Peer(0, "n1", 10), wd.Peer(1, "n1", 11), wd.Peer(2, "n2", 12), wd.Peer(3, "n2", 13)]
    assert wd._silent(peers, "n1", {0, 2}, []) == {"3": "n2"}
    assert wd._silent(peers, "n1", {0, 2, 3}, []) == {}
    assert wd._silent(peers, "n1", {0, 2}, ["rank 3"]) == {}  # rank 2 reached it: named stopped, not silent too
    assert wd._silent(peers, "n1", {0}, []) == {"2": "n2", "3": "n2"}  # rank 1 shares this host: never silent


def test_the_recording_rank_waits_for_the_ranks_of_other_hosts_until_its_deadline(tmp_path: Path) -> None:
    """A rank that said it found the hang before the wait counts, so does one that says it during the wait (written by
    a thread, as a rank of another host finds the hang a look later), and one that never does is left out once the
    deadline passes, instead of the record waiting for a rank that cannot answer."""
    peers = [wd.Peer(0, "this-host", 10), wd.Peer(1, "other-host", 11), wd.Peer(2, "other-host", 12), wd.Peer(3, "other-host", 13)]
    dog = wd.Watchdog(HangPolicy(floor_s=5), 0, peers, tmp_path, "script", 1, lambda e: None)
    dog.host = "this-host"
    dog.folder.mkdir(parents=True)
    for rank in (0, 1):
        (dog.folder / f"rank{rank}{wd.FOUND_SUFFIX}").touch()
    later = threading.Timer(0.3, (dog.folder / f"rank2{wd.FOUND_SUFFIX}").touch)
    later.start()
    try:
        answered = dog._await_answers(time.monotonic() + 3)  # rank 3 never answers: the wait ends at the deadline
    finally:
        later.join()
    assert answered == {0, 1, 2}
    assert dog._await_answers(time.monotonic()) == {0, 1, 2}  # a deadline already passed: what is there, at once


def test_the_recording_rank_waits_for_the_summary_of_a_rank_still_collecting_stacks(tmp_path: Path) -> None:
    """Rank 1 found the hang and is collecting the stacks of a stopped DataLoader worker (continued while it answers,
    so rank 0 found it running): the record must wait for rank 1's summary, the only one that names the worker
    stopped. A rank that said nothing is not waited for, and the wait ends at its deadline."""
    peers = [wd.Peer(0, "h", 10), wd.Peer(1, "h", 11), wd.Peer(2, "h", 12)]
    dog = wd.Watchdog(HangPolicy(floor_s=5), 0, peers, tmp_path, "script", 1, lambda e: None)
    dog.folder.mkdir(parents=True)
    wd._first(dog.folder / "rank0.json", {"rank": 0, "stopped": []})
    summary = {"rank": 1, "stopped": ["rank 1 worker 4321"]}
    later = threading.Timer(0.5, wd._first, (dog.folder / "rank1.json", summary))
    # Rank 2 said nothing: its summary, written long after rank 1's, must not be what the wait waited for.
    much_later = threading.Timer(20, wd._first, (dog.folder / "rank2.json", {"rank": 2, "stopped": []}))
    later.start()
    much_later.start()
    try:
        summaries = dog._await_summaries({0, 1}, time.monotonic() + 60)
    finally:
        later.join()
        much_later.cancel()
    assert [s["stopped"] for s in summaries] == [[], ["rank 1 worker 4321"]]
    assert [s["rank"] for s in dog._await_summaries({0, 1, 2}, time.monotonic() + 0.5)] == [0, 1]  # the deadline ends the wait


def test_labels_say_where_the_run_hung_and_why_a_repeat_is_not_retried() -> None:
    record = {
        "rank": 0,
        "host": "n1",
        "step": 7,
        "phase": "step",
        "quiet_s": 5.2,
        "bound_s": 5.0,
        "frame": "f.py:1 in g",
        "user_frame": "train.py:3 in main",
        "stopped": ["rank 1"],
        "stacks": "hangs/1/2",
    }
    label = hang_label(record)
    assert "step 7" in label and "train.py:3 in main" in label and "stopped: rank 1" in label and "hangs/1/2/" in label
    assert "no answer from rank 3 on n2" in hang_label({**record, "silent": {"3": "n2"}}) and "no answer" not in label
    assert repeated_hang_reason(record).startswith("the attempt hung at step 7") and "LEGATO_HANG" in repeated_hang_reason(record)


CHILD = textwrap.dedent(
    """
    import sys, time
    from legato.system import stacks
    stacks.arm()

    def waits_here():
        sys.stdout.write("armed\\n"); sys.stdout.flush()
        time.sleep(600)

    waits_here()
    """
)


def test_a_stopped_process_answers_with_its_stacks_and_an_unarmed_one_with_none() -> None:
    armed = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert armed.stdout is not None and armed.stdout.readline() == "armed\n"
        os.kill(armed.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30  # the kernel stops it a moment after the signal is sent
        while not stacks.stopped(armed.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stacks.stopped(armed.pid)
        answer = stacks.collect(armed.pid)
        assert answer is not None and "in waits_here" in answer, answer
        assert stacks.collect(plain.pid, wait_s=0.5) is None
    finally:
        for proc in (armed, plain):
            proc.kill()
            proc.wait()
