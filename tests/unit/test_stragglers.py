"""Naming a straggler from the ranks' pace windows: the rule (how much slower, how persistently, above what floor) on
planted windows, and one rank's Pace on a real module in this process (which forwards it times, what it writes). Real
ranks with a planted slow forward are tests/e2e/test_slow_rank.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from legato.orchestrator.stragglers import read_pace, stragglers
from legato.paths import RunPaths
from legato.session import pace as pace_module
from legato.session.pace import Pace


def windows(forward: list[float], data: list[float] | None = None, host: str = "n1") -> list[dict]:
    data = data or [1.0] * len(forward)
    return [{"step": 10 * i, "host": host, "forward_ms": f, "data_ms": d, "step_ms": 100.0} for i, (f, d) in enumerate(zip(forward, data))]


def test_a_rank_slower_in_every_window_is_named_with_its_host_and_margin() -> None:
    (named,) = stragglers({0: windows([20.0, 21.0, 20.0]), 1: windows([31.0, 30.0, 32.0], host="n2"), 2: windows([20.5, 20.0, 21.0])})
    assert (named.rank, named.host, named.measure, named.ms, named.others_ms, named.slower_in, named.windows) == (
        1,
        "n2",
        "forward",
        31.0,
        20.5,
        3,
        3,
    )
    assert named.label == "rank 1 on n2 is slower: forward 31.0 ms against 20.5 ms for the others (+51%), in 3 of 3 windows"


def test_a_slow_data_wait_is_named_as_such() -> None:
    (named,) = stragglers({0: windows([5.0] * 3, [2.0, 2.0, 2.0]), 1: windows([5.0] * 3, [9.0, 8.0, 12.0])})
    assert (named.rank, named.measure) == (1, "data wait")


def test_nobody_is_named_for_a_hiccup_noise_under_a_millisecond_or_a_share_of_the_step_or_one_window() -> None:
    assert stragglers({0: windows([20.0, 20.0, 20.0]), 1: windows([20.0, 40.0, 20.0])}) == []  # one window in three
    assert stragglers({0: windows([0.2, 0.2, 0.2]), 1: windows([0.9, 0.9, 0.9])}) == []  # 4.5x, but 0.7 ms
    assert stragglers({0: windows([20.0]), 1: windows([40.0])}) == []  # one window is not persistence
    # +39% and 1.8 ms more data wait in 2 of 3 windows, as a loaded host made it in CI: under 5% of a 100 ms step
    assert stragglers({0: windows([5.0] * 3, [6.6, 6.7, 4.0]), 1: windows([5.0] * 3, [4.8, 4.8, 4.8])}) == []
    assert stragglers({0: windows([5.0] * 3, [9.9, 9.9, 4.0]), 1: windows([5.0] * 3, [4.8, 4.8, 4.8])})  # 5.1 ms: named
    assert stragglers({0: windows([20.0, 20.0])}) == []  # one rank: no one to compare with


def test_pace_times_the_steps_forward_only_and_writes_its_window(tmp_path: Path) -> None:
    module = torch.nn.Linear(4, 1)
    path = RunPaths(tmp_path).pace("script", 1, 0)
    pace = Pace(path, module, rank=0)
    x = torch.randn(2, 4)
    for step in range(1, 4):
        pace.yielded()
        module(x)
        module(x)  # a second forward in the step (a validation): not the step's
        pace.stepped(step)
    pace.close(3)
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    assert (line["step"], line["steps"]) == (3, 3) and line["forward_ms"] is not None and line["data_ms"] is not None
    assert not module._forward_hooks and not module._forward_pre_hooks  # taken off at the attempt's end
    assert read_pace(tmp_path, "script", 1) == {0: [line]}


def test_no_module_no_forward_times_and_no_hooks(tmp_path: Path) -> None:
    path = RunPaths(tmp_path).pace("script", 1, 1)
    pace = Pace(path, None, rank=1)
    pace.yielded()
    pace.stepped(1)
    pace.close(1)
    assert json.loads(path.read_text())["forward_ms"] is None


def test_the_forward_is_hooked_only_on_the_steps_it_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module with hooks takes torch's slower call path: the hooks are on it for a timed step only, and a step within
    SAMPLE_S of the last timed one is not timed (every step is, once SAMPLE_S is shorter than a step)."""
    module = torch.nn.Linear(4, 1)
    x = torch.randn(2, 4)
    pace = Pace(RunPaths(tmp_path).pace("script", 1, 0), module, rank=0)
    hooked = []
    for step in range(1, 4):
        pace.yielded()
        hooked.append(bool(module._forward_hooks) and bool(module._forward_pre_hooks))
        module(x)
        pace.stepped(step)
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert hooked == [True, False, False] and len(pace._forward) == 1
    monkeypatch.setattr(pace_module, "SAMPLE_S", 0.0)
    for step in range(4, 6):
        pace.yielded()
        module(x)
        pace.stepped(step)
    assert len(pace._forward) == 3
    pace.close(5)
