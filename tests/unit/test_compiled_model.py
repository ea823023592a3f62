"""A model under torch.compile, in one process: what the Session saves and finds under the wrappers, and a resume whose
model switched between compiled and eager, refused in strict mode and named as the cause of its replay's divergence in
fast. Real Sessions and real stops (the process signals itself through Chaos, as in test_session_table.py); four real
ranks resumed bitwise under torch.compile, in both orders around DDP: e2e/test_reduction.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import NEEDS_CXX

import legato
from legato.errors import EXIT_STOPPED
from legato.session.wrappers import ddp_of, runs_compiled, unwrap
from legato.store.resumable import check_compatible

# torch's own, when torch.compile first imports dynamo.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

STEPS = 8


def run(run_dir: Path, compiled: bool, stop_after: int | None = None, replay_steps: int = 0) -> legato.Session:
    """One 'process' of a small run with dropout; `compiled`: its model= and its forward pass go through torch.compile."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 1))
    net = torch.compile(model) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    features = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    loader = legato.resumable_loader(torch.utils.data.TensorDataset(features, features.sum(1, keepdim=True)), batch_size=4, seed=0)
    chaos = legato.Chaos(signal_at_steps=(stop_after,)) if stop_after is not None else legato.Chaos()
    session = legato.Session(
        run_dir,
        model=net,
        optimizer=optimizer,
        loader=loader,
        total_steps=STEPS,
        chaos=chaos,
        census="off",
        checkpoint=legato.CheckpointPolicy(hash_every_steps=1, replay_steps=replay_steps, replay_cost=0),
    )
    for x, y in session:
        loss = F.mse_loss(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        session.report(loss)
    return session


def manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"step_{step}" / "manifest.json").read_text())


def test_the_wrappers_are_looked_through_in_either_order() -> None:
    """Saved under the module's own keys (as DCP's state-dict helpers name them), DDP found under torch.compile's wrapper.
    Nothing is compiled here: torch.compile only wraps until the first call."""
    model = torch.nn.Linear(2, 1)
    assert unwrap(torch.compile(model)) is model and unwrap(model) is model
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        outer, inner = torch.compile(ddp), torch.nn.parallel.DistributedDataParallel(torch.compile(model))
        assert unwrap(outer) is model and unwrap(inner) is model
        assert ddp_of(outer) is ddp and ddp_of(inner) is inner and ddp_of(model) is model
    finally:
        torch.distributed.destroy_process_group()


def test_a_model_runs_compiled_through_a_wrapper_or_a_module_compiled_in_place() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert not runs_compiled(model)
    assert runs_compiled(torch.compile(model))
    model[1].compile()  # torchtitan's way: blocks compiled in place
    assert runs_compiled(model)


def test_the_check_names_both_sides_refuses_in_strict_warns_in_fast_and_passes_what_it_cannot_know(
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = Path("/r/checkpoints/step_5")
    saved = {"world_size": 1, "torch_version": "2.13.0", "threads": 1, "training": None, "ranks": [{"rank": 0}], "model_compiled": True}
    with pytest.raises(legato.UsageError) as info:
        check_compatible(saved, path, 1, None, "2.13.0", threads=1, strict=True, compiled=False)
    text = str(info.value)
    assert "ran under torch.compile, and this run's model runs eagerly" in text and "compile it in every attempt, or in none" in text
    assert 'seed_everything(seed, rank, mode="fast")' in text
    check_compatible(saved, path, 1, None, "2.13.0", threads=1, strict=False, compiled=False)
    assert "Continuing because the determinism mode" in caplog.text
    check_compatible(saved, path, 1, None, "2.13.0", threads=1, strict=True, compiled=True)
    check_compatible(saved, path, 1, None, "2.13.0", threads=1, strict=True, compiled=None)  # the launcher's check: not known there
    check_compatible({**saved, "model_compiled": None}, path, 1, None, "2.13.0", threads=1, strict=True, compiled=False)


def test_an_eager_run_resumed_compiled_is_refused_in_strict_before_anything_is_restored(tmp_path: Path) -> None:
    assert run(tmp_path, compiled=False, stop_after=4).exit_code == EXIT_STOPPED
    assert manifest(tmp_path, 4)["model_compiled"] is False
    before = {p: p.read_bytes() for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()}
    torch.use_deterministic_algorithms(True)  # a script's own Session is strict when torch runs deterministic
    try:
        with pytest.raises(legato.UsageError, match="ran eagerly, and this run's model runs under torch.compile"):
            run(tmp_path, compiled=True)
    finally:
        torch.use_deterministic_algorithms(False)
    assert {p: p.read_bytes() for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()} == before


@NEEDS_CXX
def test_in_fast_mode_the_replay_that_diverges_names_the_switch_not_a_guess(tmp_path: Path) -> None:
    assert run(tmp_path, compiled=False, stop_after=4, replay_steps=4).exit_code == EXIT_STOPPED
    with pytest.raises(legato.ResumeMismatchError) as info:
        run(tmp_path, compiled=True, replay_steps=4)
    text = str(info.value)
    assert "the replay of steps 1..4 diverged" in text and "Likely cause" not in text, text
    assert "ran eagerly, and this run's model runs under torch.compile" in text
