"""The census of unsaved state, in one process: planted objects of each kind are found and named, covered ones are not.

Real objects (no fakes): modules, optimizers, schedulers, scalers, generators
planted as locals, attributes, module globals and garbage. The same census
with 2 real ranks and real stops: e2e/test_unsaved_state.py.
"""

from __future__ import annotations

import copy
import gc
import logging
import random
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fit_step
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import DataLoader, TensorDataset

import legato
from legato.errors import UsageError
from legato.session.unsaved import Census
from legato.state.census import find_unsaved, kind_of


class Holder:
    """A user's own object: the census walks its attributes."""


class Counter:
    """A user's own object with state_dict/load_state_dict."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))


def found(registered: list, **_planted: object) -> dict[str, tuple[str, str]]:
    """{where's variable path: (kind, type)} of what the census finds from the caller's frame."""
    return {f.where.split(" (")[0]: (f.kind, f.type) for f in find_unsaved(registered, frame=sys._getframe(1))}


def test_a_clean_loop_has_nothing_unsaved() -> None:
    model = net()
    wrapped = torch.nn.ModuleDict({"inner": model})  # holds only the model's tensors: covered, like DDP or torch.compile
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer, [torch.optim.lr_scheduler.ConstantLR(optimizer), torch.optim.lr_scheduler.StepLR(optimizer, 2)], milestones=[2]
    )
    loader = DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=2, shuffle=True, generator=torch.Generator())
    loss_fn = torch.nn.MSELoss()  # no parameters, no buffers: no state
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    global_rng, torch_rng = random._inst, torch.default_generator  # saved by legato itself
    assert found([model, optimizer, scheduler, loader]) == {}
    del wrapped, loss_fn, scaler, global_rng, torch_rng


def test_every_kind_planted_is_found_where_it_lives() -> None:
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = AveragedModel(model)
    manual = copy.deepcopy(model)
    second = torch.optim.Adam(manual.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    scaler = torch.amp.GradScaler("cpu")
    trainer = Holder()
    trainer.noise = torch.Generator()
    trainer.rngs = {"np": np.random.default_rng(0), "py": random.Random(1)}
    trainer.counter = Counter()
    assert found([model, optimizer]) == {
        "ema": ("module", "torch.optim.swa_utils.AveragedModel"),
        "manual": ("module", "torch.nn.modules.container.Sequential"),
        "second": ("optimizer", "torch.optim.adam.Adam"),
        "scheduler": ("LR scheduler", "torch.optim.lr_scheduler.StepLR"),
        "scaler": ("GradScaler", "torch.amp.grad_scaler.GradScaler"),
        "trainer.noise": ("torch.Generator", "torch._C.Generator"),
        "trainer.rngs['np']": ("numpy Generator", "numpy.random._generator.Generator"),
        "trainer.rngs['py']": ("random.Random", "random.Random"),
        "trainer.counter": ("object with state_dict", f"{__name__}.Counter"),
    }
    # Registered (as extras would be) or ignored, each is covered, with everything it holds.
    assert found([model, optimizer, ema, manual, second, scheduler, scaler, trainer]) == {}


class Unprintable:
    """A dict key that fails when formatted: the census must name what it keys without calling its repr."""

    def __repr__(self) -> str:
        raise AssertionError("the census formatted a dict key")


def test_objects_under_keys_that_are_not_literals_are_named_by_the_key_type_never_its_repr() -> None:
    """An optimizer's state is keyed by parameters: formatting each one at every census was most of its cost."""
    model = net()
    optimizer = torch.optim.Adam(model.parameters())
    fit_step(model, optimizer, torch.randn(4, 3), torch.randn(4, 1))
    by_key = {Unprintable(): torch.optim.SGD(net().parameters(), lr=0.1)}
    assert found([model, optimizer]) == {"by_key[<Unprintable #0>]": ("optimizer", "torch.optim.sgd.SGD")}
    assert found([model, optimizer, by_key]) == {}


def test_a_loader_with_persistent_workers_drawing_from_the_global_rng_is_named() -> None:
    """Only a loader that draws its workers' seed from the global RNG once, at its first iteration; none starts a worker here."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = TensorDataset(torch.zeros(8, 3))
    val_loader = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    own_generator = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True, generator=torch.Generator())
    restarting = DataLoader(data, batch_size=4, num_workers=2)
    stateful = StatefulDataLoader(data, batch_size=4)
    train_loader = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    assert found([train_loader]) == {
        "val_loader": ("DataLoader with persistent workers", "torch.utils.data.dataloader.DataLoader"),
        "stateful": ("object with state_dict", "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader"),
    }
    [finding] = [f for f in find_unsaved([train_loader, stateful], frame=sys._getframe()) if f.kind != "object with state_dict"]
    assert finding.size == "2 workers, no generator"
    del val_loader, own_generator, restarting


def test_a_finding_names_its_frame_and_size() -> None:
    model = net()
    ema = AveragedModel(model)
    [finding] = find_unsaved([model], frame=sys._getframe())
    assert finding.where == (
        f"ema (local of test_a_finding_names_its_frame_and_size() in {__file__}:"
        f"{test_a_finding_names_its_frame_and_size.__code__.co_firstlineno})"
    )
    # 3*4+4 + 4+4 (+2 BN running stats, +1 batches tracked) + 4+1, and the AveragedModel's n_averaged.
    assert finding.size == "39 elements, 0.00 MiB"
    del ema


def test_only_the_outermost_of_nested_modules_is_named() -> None:
    model = net()
    ema = AveragedModel(model)
    inner = ema.module  # also a variable, but inside the AveragedModel: one finding
    assert found([model]) == {"ema": ("module", "torch.optim.swa_utils.AveragedModel")}
    del inner


def test_a_module_no_variable_names_is_found_by_the_collector_and_garbage_is_not() -> None:
    model = net()
    hidden = types.ModuleType("users_state")
    hidden.ema = copy.deepcopy(model)
    sys.modules["users_state"] = hidden
    try:
        garbage = copy.deepcopy(model)
        garbage.cycle = [garbage]  # unreachable once deleted, collected only by a collection
        gc.disable()
        del garbage
        [finding] = find_unsaved([model], frame=sys._getframe())
        assert finding.kind == "module" and finding.where == "ema (global of module users_state)"
    finally:
        gc.enable()
        del sys.modules["users_state"]


FORKED_RANK = r"""
import gc, sys, types
from legato.runtime.launch import preloaded_rank
from legato.state.census import _swept_objects, find_unsaved
from legato.system.forking import fork_run

preloaded_rank()  # what a launcher imports before it forks its ranks
assert _swept_objects() == [], "the forking parent holds state the sweep looks for"
held = len(gc.get_objects())


def rank():
    import torch

    hidden = types.ModuleType("users_state")
    hidden.ema = torch.nn.Linear(2, 2)
    sys.modules["users_state"] = hidden
    [finding] = find_unsaved([], frame=sys._getframe())
    assert finding.where == "ema (global of module users_state)", finding
    return 0 if len(gc.get_objects()) < held // 10 else 3


sys.exit(fork_run(["rank"], lambda: None, rank).wait(timeout=120))
"""


def test_a_forked_rank_sweeps_only_what_it_made_and_its_parent_holds_nothing_the_sweep_looks_for() -> None:
    """A rank legato forks leaves what its parent imported to the collector's permanent generation, which the sweep
    passes over (legato.system.forking): the parent, which ran no user code, holds no object of a swept kind, and the
    sweep in the child still finds a module made there. Exit 3: the child's collector lists the parent's objects."""
    proc = subprocess.run([sys.executable, "-c", FORKED_RANK], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


class Unhashable(type):
    """A metaclass with __eq__ and no __hash__: its classes cannot go into a set, which the sweep's fast path uses."""

    def __eq__(cls, other: object) -> bool:
        return cls is other

    __hash__ = None  # type: ignore[assignment]


def test_the_collector_sweep_still_finds_a_module_beside_a_class_that_cannot_be_hashed() -> None:
    model = net()
    odd = Unhashable("Odd", (), {})()
    hidden = types.ModuleType("users_state")
    hidden.ema = copy.deepcopy(model)
    sys.modules["users_state"] = hidden
    try:
        [finding] = find_unsaved([model], frame=sys._getframe())
        assert finding.kind == "module" and finding.where == "ema (global of module users_state)" and odd is not None
    finally:
        del sys.modules["users_state"]


def test_kinds_that_hold_no_state_are_not_state() -> None:
    assert kind_of(torch.nn.ReLU()) is None and kind_of(torch.amp.GradScaler("cpu", enabled=False)) is None
    assert kind_of(torch.nn.Module) is None and kind_of(torch) is None and kind_of(torch.zeros(2)) is None
    assert kind_of(torch.nn.Linear(1, 1)) == "module"


# -- the Session's census --------------------------------------------------------


def loop_parts() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = net()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def run(session: legato.Session, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for step in session:
        loss = model(torch.full((4, 3), float(step))).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.report(loss)


def test_the_session_warns_once_on_rank_0_and_records_the_finding(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, optimizer = loop_parts()
    ema = AveragedModel(model)
    events: list[dict] = []
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=optimizer,
        total_steps=6,
        on_event=events.append,
        checkpoint=legato.CheckpointPolicy(every_steps=2, replay_steps=0),
    )
    with caplog.at_level(logging.WARNING, logger="legato.session.unsaved"):
        run(session, model, optimizer)
    warnings = [r.getMessage() for r in caplog.records if "does not save" in r.getMessage()]
    assert len(warnings) == 1 and "torch.optim.swa_utils.AveragedModel (module" in warnings[0], warnings
    assert "found as ema (local of test_the_session_warns_once" in warnings[0] and "start of this attempt" in warnings[0]
    records = [e for e in events if e["event"] == "unsaved_state"]
    assert [(r["when"], r["strict"], len(r["objects"])) for r in records] == [("start", False, 1)]
    del ema


def test_an_object_made_during_the_run_is_named_at_the_first_checkpoint(tmp_path: Path) -> None:
    model, optimizer = loop_parts()
    events: list[dict] = []
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=optimizer,
        total_steps=4,
        on_event=events.append,
        checkpoint=legato.CheckpointPolicy(every_steps=2, replay_steps=0),
    )
    late = None
    for step in session:
        late = late or torch.Generator()
        optimizer.step()
        session.report(float(step))
    assert [(r["when"], r["step"], r["objects"][0]["kind"]) for r in events if r["event"] == "unsaved_state"] == [
        ("periodic", 2, "torch.Generator")
    ]


def test_strict_refuses_at_a_checkpoint_after_committing_it_and_leaves_no_scan_running(tmp_path: Path) -> None:
    """The scan runs in a thread beside the checkpoint's write: the verdict still follows the commit, and the scan ends with it."""
    model, optimizer = loop_parts()
    events: list[dict] = []
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=optimizer,
        total_steps=4,
        on_event=events.append,
        census="strict",
        checkpoint=legato.CheckpointPolicy(every_steps=2, replay_steps=0),
    )
    late = None
    with pytest.raises(UsageError, match=r"torch\._C\.Generator \(torch\.Generator.*found as late"):
        for step in session:
            late = late or torch.Generator()
            optimizer.step()
            session.report(float(step))
    kinds = [e["event"] for e in events if e["event"] in ("checkpoint_committed", "unsaved_state")]
    assert kinds == ["checkpoint_committed", "unsaved_state"] and session.step == 2
    assert (tmp_path / "checkpoints" / "step_2" / "manifest.json").is_file()
    assert scanning() == []


def test_ignored_objects_are_not_named(tmp_path: Path) -> None:
    model, optimizer = loop_parts()
    teacher, events = net(), []
    session = legato.Session(tmp_path, model=model, optimizer=optimizer, total_steps=2, on_event=events.append, census="strict")
    session.ignore(teacher)
    run(session, model, optimizer)
    assert not [e for e in events if e["event"] == "unsaved_state"]


def test_strict_refuses_to_start(tmp_path: Path) -> None:
    model, optimizer = loop_parts()
    ema = AveragedModel(model)
    session = legato.Session(tmp_path, model=model, optimizer=optimizer, total_steps=2, census="strict")
    with pytest.raises(UsageError, match=r"AveragedModel \(module.*refuses to train until each is registered, changed or ignored"):
        run(session, model, optimizer)
    assert session.step == 0 and not list((tmp_path / "checkpoints").glob("step_*"))
    del ema


def _validated_run(run_dir: Path, own_generator: bool, stop_after: int | None = None, events: list | None = None) -> list[str]:
    """A loop with dropout that validates after each epoch over a loader with one persistent worker; the loss bits of
    each step it trains (a resume replays from a base in the stopped epoch, after the validation that started the
    worker)."""
    torch.manual_seed(0)
    data = TensorDataset(
        torch.randn(40, 3, generator=torch.Generator().manual_seed(1)), torch.randn(40, 1, generator=torch.Generator().manual_seed(2))
    )
    val_loader = DataLoader(
        data, batch_size=8, num_workers=1, persistent_workers=True, generator=torch.Generator() if own_generator else None
    )
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    chaos = legato.Chaos(signal_at_steps=(stop_after,)) if stop_after else legato.Chaos()
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        loader=DataLoader(data, batch_size=4, shuffle=True),
        total_epochs=4,
        chaos=chaos,
        checkpoint=legato.CheckpointPolicy(replay_steps=4, replay_cost=0),
        on_event=(events if events is not None else []).append,
    )
    losses = []
    for _ in session.epochs():
        for x, y in session.batches():
            loss = fit_step(model, optimizer, x, y)
            losses.append(loss.item().hex())
            session.report(loss)
        if session.stopped:
            break
        with torch.no_grad():
            for x, _ in val_loader:
                model(x)
    return losses


def test_the_persistent_validation_loader_it_names_would_diverge_a_verified_resume_and_its_own_generator_does_not(tmp_path: Path) -> None:
    """Why the census names such a loader: stopped in epoch 2 (step 25) and resumed, verified by a replay from step 24,
    the run validates at the end of epoch 2 over a loader it iterates for the first time, draws its worker's seed from
    the global RNG once more than the uninterrupted run did, and epoch 3's dropout differs. With generator= it does not."""
    for own_generator in (False, True):
        name = "own" if own_generator else "global"
        events: list[dict] = []
        uninterrupted = _validated_run(tmp_path / f"{name}-reference", own_generator, events=events)
        named = [o["kind"] for e in events if e["event"] == "unsaved_state" for o in e["objects"]]
        assert named == ([] if own_generator else ["DataLoader with persistent workers"])
        first = _validated_run(tmp_path / name, own_generator, stop_after=25)
        events = []
        rest = _validated_run(tmp_path / name, own_generator, events=events)
        assert [(e["step"], e["match"], e["replay"]["identical"]) for e in events if e["event"] == "resumed"] == [(25, True, True)]
        assert rest[: 25 - 24] == uninterrupted[24:25], "the replay of step 25"
        assert (first + rest[1:] == uninterrupted) is own_generator, name


def test_an_unknown_census_mode_is_refused(tmp_path: Path) -> None:
    model, optimizer = loop_parts()
    with pytest.raises(UsageError, match=r"census='loud'\) is not one of warn, strict, off"):
        legato.Session(tmp_path, model=model, optimizer=optimizer, total_steps=2, census="loud")


def test_a_resume_names_unsaved_state_before_it_restores_and_leaves_no_scan_running(tmp_path: Path) -> None:
    """The census of the start is told before the resume is: what legato does not save is named before "verified"."""
    model, optimizer = loop_parts()
    run(legato.Session(tmp_path, model=model, optimizer=optimizer, total_steps=2, census="off"), model, optimizer)
    model, optimizer = loop_parts()
    ema = AveragedModel(model)
    events: list[dict] = []
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=optimizer,
        total_steps=4,
        on_event=events.append,
        checkpoint=legato.CheckpointPolicy(replay_steps=0),
    )
    run(session, model, optimizer)
    kinds = [e["event"] for e in events if e["event"] in ("unsaved_state", "resumed")]
    # Failed once in a whole unit run (2026-12-02), not since: the events say which part.
    assert kinds == ["unsaved_state", "resumed"] and session.resumed is not None and session.resumed.match, events
    assert scanning() == []
    del ema


def scanning() -> list[str]:
    """The threads whose stack is inside the census's scan now (it runs on the process's I/O threads)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        walked: types.FrameType | None = frame
        while walked is not None and walked.f_code is not Census._scan.__code__:
            walked = walked.f_back
        if walked is not None:
            found.append(names.get(ident, str(ident)))
    return found
