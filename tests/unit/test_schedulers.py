"""The LR schedulers of public recipes, each through a real Session stopped mid-run (the process signals itself through
Chaos, as in test_session_table.py) and resumed with a replay: every step's loss bits and learning rate equal the
uninterrupted run's. Warm-up then cosine with SequentialLR (torchvision's classification reference), OneCycleLR,
warm restarts, a ChainedScheduler, ReduceLROnPlateau stepped with the loss, and CyclicLR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.optim import lr_scheduler as lr

import legato
from legato.errors import EXIT_OK, EXIT_STOPPED

SCHEDULERS = {
    "warmup_cosine": lambda opt: lr.SequentialLR(
        opt, [lr.LinearLR(opt, start_factor=0.01, total_iters=5), lr.CosineAnnealingLR(opt, T_max=15)], milestones=[5]
    ),
    "one_cycle": lambda opt: lr.OneCycleLR(opt, max_lr=0.5, total_steps=20),
    "warm_restarts": lambda opt: lr.CosineAnnealingWarmRestarts(opt, T_0=4, T_mult=2),
    "chained": lambda opt: lr.ChainedScheduler([lr.ExponentialLR(opt, gamma=0.9), lr.StepLR(opt, step_size=3, gamma=0.5)]),
    "plateau": lambda opt: lr.ReduceLROnPlateau(opt, patience=1),
    "cyclic": lambda opt: lr.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=3),
}


STOP = legato.Chaos(signal_at_steps=(7,))


def run(run_dir: Path, kind: str, chaos: legato.Chaos | None = None) -> legato.Session:
    legato.seed_everything(7, rank=0, mode="fast")
    features = torch.randn(96, 6, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = SCHEDULERS[kind](optimizer)
    loader = legato.resumable_loader(torch.utils.data.TensorDataset(features, features.sum(1, keepdim=True)), batch_size=8, seed=7)
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        total_steps=20,
        chaos=chaos or legato.Chaos(),
        checkpoint=legato.CheckpointPolicy(hash_every_steps=1, replay_steps=4, replay_cost=0),
    )
    for x, y in session:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if isinstance(scheduler, lr.ReduceLROnPlateau):
            scheduler.step(loss.item())
        else:
            scheduler.step()
        session.report(loss)
    return session


def steps(run_dir: Path) -> list[tuple[str, float]]:
    return [(r["loss_hex"], r["lr"]) for r in map(json.loads, (run_dir / "trajectory" / "rank0.jsonl").read_text().splitlines())]


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_a_resumed_run_keeps_every_steps_loss_and_learning_rate(tmp_path: Path, kind: str) -> None:
    assert run(tmp_path / "reference", kind).exit_code == EXIT_OK
    assert run(tmp_path / "resumed", kind, STOP).exit_code == EXIT_STOPPED
    resumed = run(tmp_path / "resumed", kind)
    assert resumed.exit_code == EXIT_OK and resumed.resumed is not None and resumed.resumed.match
    assert steps(tmp_path / "resumed") == steps(tmp_path / "reference")
    assert len({rate for _, rate in steps(tmp_path / "reference")}) > 3, "the learning rate changes along the run"


def test_a_scheduler_left_unrestored_is_named(tmp_path: Path) -> None:
    assert run(tmp_path, "warmup_cosine", STOP).exit_code == EXIT_STOPPED
    with pytest.raises(legato.ResumeMismatchError, match="Differing components: rank 0: scheduler"):
        run(tmp_path, "warmup_cosine", legato.Chaos(skip_restore=frozenset({"scheduler"})))
