"""legato.state.optimizer: a capture never initialises an optimizer container's state (torch's helper would step it).

One process, a torchtitan-style container (tests/helpers/titan_loop.py) over a plain module; the real loop at 2 and 4
ranks under FSDP2 and DDP is tests/e2e/test_optimizer_container.py.
"""

from __future__ import annotations

import torch
from helpers.titan_loop import OptimizersContainer

from legato.state.optimizer import UNSTEPPED, OptimizerState


def container() -> tuple[torch.nn.Module, OptimizersContainer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, OptimizersContainer([model], lr=0.01)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for i in steps:
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(i))
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()
        optimizer.zero_grad()


def test_the_containers_own_state_dict_steps_an_unstepped_optimizer() -> None:
    """The fault the adapter exists for: torch's helper runs a step on the first state_dict()."""
    _, optimizer = container()
    optimizer.state_dict()
    assert [float(s["step"]) for s in optimizer.optimizers[0].state.values()] == [1.0] * 4


def test_a_capture_before_the_first_step_changes_nothing_and_restores_to_no_state() -> None:
    model, optimizer = container()
    captured = OptimizerState(optimizer).state_dict()
    assert set(captured) == {UNSTEPPED} and not optimizer.optimizers[0].state
    train(model, optimizer, range(3))
    plain_model, plain = container()
    train(plain_model, plain, range(3))
    for a, b in zip(model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    optimizer.optimizers[0].param_groups[0]["lr"] = 0.5
    OptimizerState(optimizer).load_state_dict(captured)
    assert not optimizer.optimizers[0].state and optimizer.optimizers[0].param_groups[0]["lr"] == 0.01


def test_a_stepped_or_plain_optimizer_goes_through_its_own_methods() -> None:
    model, optimizer = container()
    train(model, optimizer, range(1))
    assert UNSTEPPED not in OptimizerState(optimizer).state_dict()
    adam = torch.optim.AdamW(model.parameters())
    assert OptimizerState(adam).state_dict() == adam.state_dict()
