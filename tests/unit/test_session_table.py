"""The Session's component table in one process: save -> restore -> verify, and planted faults caught and named.

One rank, no subprocess and no process group (a Session without an initialised
group runs as world size 1). A stop is the real thing: `Chaos.signal_at_steps`
makes the process send itself SIGUSR2, the session stops after that step with
a barrier checkpoint, and a fresh Session over fresh objects resumes it, as a
new process would. Every run reseeds the global RNGs as a new process does.
The replay is off here (`replay_steps=0`): these tests prove the table and the
digest check alone; test_replay.py covers the replay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import legato
from legato.errors import EXIT_OK, EXIT_STOPPED

STEPS = 12


class Ema:
    """A user's extra state: an exponential moving average of the loss (a Stateful extra)."""

    def __init__(self) -> None:
        self.value = torch.zeros(())

    def state_dict(self) -> dict:
        return {"value": self.value.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"].clone()


def run(
    run_dir: Path, *, stop_after: int | None = None, chaos: legato.Chaos | None = None, policy: legato.CheckpointPolicy | None = None
) -> legato.Session:
    """One 'process' of a training run: fresh objects, reseeded RNGs, one pass over the session."""
    legato.seed_everything(7, rank=0, mode="fast")
    features = torch.randn(96, 6, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(features, features.sum(1, keepdim=True))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    loader = legato.resumable_loader(data, batch_size=8, seed=7)
    ema = Ema()
    base = chaos or legato.Chaos()
    if stop_after is not None:
        base = legato.Chaos(
            signal_at_steps=(stop_after,), skip_restore=base.skip_restore, consume_rng_after_restore=base.consume_rng_after_restore
        )
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        total_steps=STEPS,
        extras={"ema": ema},
        checkpoint=policy or legato.CheckpointPolicy(hash_every_steps=1, replay_steps=0),
        chaos=base,
    )
    for x, y in session:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        ema.value = 0.9 * ema.value + 0.1 * loss.detach()
        session.report(loss)
    return session


def trajectory(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectory" / "rank0.jsonl").read_text().splitlines()]


def manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"step_{step}" / "manifest.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    assert run(run_dir).exit_code == EXIT_OK
    return run_dir


def test_save_restore_verify_continues_bit_for_bit(reference: Path, tmp_path: Path) -> None:
    first = run(tmp_path, stop_after=5)
    assert first.exit_code == EXIT_STOPPED and first.step == 5
    step_dir = tmp_path / "checkpoints" / "step_5"
    assert {"model.pt", "train_state.pt", "rank0.pt", "manifest.json"} <= {p.name for p in step_dir.iterdir()}
    names = set(manifest(tmp_path, 5)["ranks"][0]["components"])
    expected = {
        "model",
        "optimizer",
        "scheduler",
        "counters",
        "metrics",
        "grads",
        "buckets",
        "forward_sync",
        "extra.ema",
        "data",
        "rng.python",
        "rng.numpy",
        "rng.torch",
        "rng.gen.loader",
    }
    assert names == expected | ({"rng.cuda"} if torch.cuda.is_available() else set())
    # Replicated state once in rank 0's shared files, per-rank state (and batch-norm buffers) in rank0.pt.
    shared = torch.load(step_dir / "train_state.pt", weights_only=True)
    own = torch.load(step_dir / "rank0.pt", weights_only=True)
    assert set(shared) == {"optimizer", "counters", "buckets"}
    assert set(own) == {
        "scheduler",
        "metrics",
        "grads",
        "forward_sync",
        "extra.ema",
        "data",
        "rng.python",
        "rng.numpy",
        "rng.torch",
        "rng.gen.loader",
        "model_buffers",
    } | ({"rng.cuda"} if torch.cuda.is_available() else set())
    assert set(own["model_buffers"]) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}

    second = run(tmp_path)
    assert second.exit_code == EXIT_OK and second.resumed is not None and second.resumed.match
    assert second.resumed.step == 5
    assert manifest(tmp_path, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    assert trajectory(tmp_path) == trajectory(reference)


# The data position holds the epoch counters, so leaving it unrestored also shows in `counters`.
UNRESTORED = {"data": "counters, data", "metrics": "metrics", "model": "model", "optimizer": "optimizer"}


@pytest.mark.parametrize("component", ["model", "optimizer", "scheduler", "extra.ema", "data", "metrics", "rng.torch"])
def test_a_component_left_unrestored_is_caught_and_named(tmp_path: Path, component: str) -> None:
    run(tmp_path, stop_after=5)
    with pytest.raises(legato.ResumeMismatchError) as caught:
        run(tmp_path, chaos=legato.Chaos(skip_restore=frozenset({component})))
    assert f"Differing components: rank 0: {UNRESTORED.get(component, component)}." in str(caught.value)


def test_verify_warn_continues_and_records_the_mismatch(tmp_path: Path) -> None:
    run(tmp_path, stop_after=5)
    session = run(
        tmp_path, chaos=legato.Chaos(skip_restore=frozenset({"rng.torch"})), policy=legato.CheckpointPolicy(verify="warn", replay_steps=0)
    )
    assert session.exit_code == EXIT_OK
    assert session.resumed is not None and session.resumed.mismatches == {0: ["rng.torch"]}


def test_rng_drawn_after_the_restore_passes_the_digest_check_but_not_the_trajectory(reference: Path, tmp_path: Path) -> None:
    """Without the replay, the digest check proves only the restore: the planted draw after it shows in the first resumed step."""
    run(tmp_path, stop_after=5)
    session = run(
        tmp_path,
        chaos=legato.Chaos(consume_rng_after_restore=("torch",)),
        policy=legato.CheckpointPolicy(hash_every_steps=1, replay_steps=0),
    )
    assert session.resumed is not None and session.resumed.match
    ref, got = trajectory(reference), trajectory(tmp_path)
    assert got[:5] == ref[:5] and got[5]["loss_hex"] != ref[5]["loss_hex"]


def test_an_extra_without_state_dict_is_refused(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    loader = legato.resumable_loader(torch.utils.data.TensorDataset(torch.zeros(8, 2)), batch_size=2, seed=0)
    with pytest.raises(legato.UsageError, match="no state_dict"):
        legato.Session(
            tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader, total_steps=2, extras={"x": 3}
        )
