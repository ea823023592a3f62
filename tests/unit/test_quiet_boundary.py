"""The quiet boundary (legato.session.session `_next_loud`, `Saver.quiet_end`) is the general step boundary in fewer
calls: a run whose every boundary takes the general path writes the same trajectory (state hashes included), checkpoints
and replay bases at the same steps with the same bits, and stops at the same step after a signal sent from inside the
body, before and after a resume. No quiet boundary falls where something is due or where the agreement checks (at one
rank a skipped check changes no bit here, so it is asserted directly)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import fit_step, trajectory
from torch.utils.data import TensorDataset

import legato
from legato.dist.stop import StopAgreement
from legato.session.saving import Saver
from legato.session.session import Session
from legato.store.manifest import list_checkpoints

STOP_AFTER = 17
TOTAL = 30


def _attempt(run_dir: Path, stop_after: int | None) -> tuple[int, dict]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 3, generator=torch.Generator().manual_seed(0)), torch.randn(96, 1))
    model = torch.nn.Linear(3, 1)
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        total_steps=TOTAL,
        loader=legato.resumable_loader(data, batch_size=4, seed=1),
        checkpoint=legato.CheckpointPolicy(every_steps=7, hash_every_steps=5, replay_steps=3, replay_cost=0),
    )
    for x, y in session:
        session.report(fit_step(model, session.optimizer, x, y))
        if session.step + 1 == stop_after:
            os.kill(os.getpid(), signal.SIGUSR2)
    return session.step, {k: v.clone() for k, v in model.state_dict().items()}


def _run(run_dir: Path) -> dict:
    """A run stopped by a signal after STOP_AFTER steps, then resumed to the end: what it leaves that must not depend on
    which path each boundary took."""
    stopped_at, _ = _attempt(run_dir, STOP_AFTER)
    finished_at, state = _attempt(run_dir, None)
    manifests = [json.loads((d / "manifest.json").read_text()) for d in list_checkpoints(run_dir / "checkpoints")]
    return {
        "stopped_at": stopped_at,
        "finished_at": finished_at,
        "trajectory": trajectory(run_dir, 0),
        "checkpoints": [(m["step"], m["global_hash"], (m.get("replay") or {}).get("from_step")) for m in manifests],
        "state": {k: v.numpy().tobytes().hex() for k, v in state.items()},
    }


@pytest.fixture
def quiet_ends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None]]:
    """The boundaries that took the quiet path: each step, and the step of the agreement's next check then."""
    seen: list[tuple[int, int | None]] = []
    agreements: list[StopAgreement] = []
    made, quiet_end = StopAgreement.__init__, Saver.quiet_end

    def kept(self: StopAgreement, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)  # type: ignore[arg-type]
        agreements.append(self)

    def counted(self: Saver, *args: object) -> None:
        seen.append((self.position.step, agreements[-1]._next_check))
        quiet_end(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(StopAgreement, "__init__", kept)
    monkeypatch.setattr(Saver, "quiet_end", counted)
    return seen


def test_a_run_with_quiet_boundaries_leaves_the_bits_of_one_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quiet_ends: list[tuple[int, int | None]]
) -> None:
    quiet = _run(tmp_path / "quiet")
    assert quiet_ends, "no boundary was quiet: the comparison would be of the general path with itself"
    assert quiet["stopped_at"] == STOP_AFTER and quiet["finished_at"] == TOTAL
    due = {n * k for n in (7, 5, 3) for k in range(1, TOTAL // n + 1)} | {TOTAL}  # checkpoints, hashes, bases, the end
    assert not due & {step for step, _ in quiet_ends}, "a boundary with something due was quiet"
    swallowed = [(step, check) for step, check in quiet_ends if check is None or step >= check]
    assert not swallowed, f"quiet boundaries at or past the agreement's next check: {swallowed}"
    monkeypatch.setattr(Session, "_next_loud", lambda self, step: step + 1)
    quiet_ends.clear()
    loud = _run(tmp_path / "loud")
    assert not quiet_ends
    assert quiet == loud


def test_a_quiet_boundary_that_forgot_its_learning_rate_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted fault: the quiet path writes its trajectory line without the learning rate."""
    loud_dir = tmp_path / "loud"
    with monkeypatch.context() as patch:
        patch.setattr(Session, "_next_loud", lambda self, step: step + 1)
        loud = _run(loud_dir)
    real = Saver.quiet_end
    monkeypatch.setattr(Saver, "quiet_end", lambda self, loss, lr: real(self, loss, None))
    assert _run(tmp_path / "forgetful")["trajectory"] != loud["trajectory"]
