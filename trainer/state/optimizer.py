"""An optimizer as a state component, captured without changing it: a container's `state_dict()` can step it.

An optimizer container (torchtitan's style: one `Optimizer` holding an
optimizer per model part) builds its `state_dict()` with torch's
`get_optimizer_state_dict`, which first initialises an optimizer that has no
state yet by running a step with zero gradients and the learning rate at 0.
For AdamW that leaves its step count at 1: a capture at step 0 (the replay
base a Session takes before the first step) would put every later step one
count ahead of the plain loop's, changing the run it was meant to record.

`OptimizerState` captures an optimizer that has not stepped (no state in it
or the optimizers it holds) through torch's base `Optimizer.state_dict` of
each, which reads the param groups and changes nothing, and restores such a
capture through the base `load_state_dict`, leaving every optimizer without
state as the plain loop has it before its first step. A stepped optimizer, or
one with torch's own `state_dict`, goes through its own methods unchanged.
This module must never run an optimizer step or touch a gradient.
"""

from __future__ import annotations

from typing import Any

import torch

UNSTEPPED = "unstepped"  # the key of a capture taken before the first step: each optimizer's base state dict


def _optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The optimizer and every optimizer it holds (a container's `optimizers`), outermost first."""
    inner = getattr(optimizer, "optimizers", ())
    held = [o for o in inner if isinstance(o, torch.optim.Optimizer)] if isinstance(inner, (list, tuple)) else []
    return [optimizer, *held] if isinstance(optimizer, torch.optim.Optimizer) else held


def _own_state_dict(optimizer: Any) -> bool:
    """Whether `optimizer`'s `state_dict` is its class's own (it may initialise state), not torch's base one."""
    return getattr(type(optimizer), "state_dict", None) is not torch.optim.Optimizer.state_dict


class OptimizerState:
    """The user's optimizer as a `Stateful` whose capture never initialises state the loop has not made yet."""

    def __init__(self, optimizer: Any) -> None:
        self.obj = optimizer  # named as Shards names what it wraps: messages name the user's class under both

    def _unstepped(self) -> list[torch.optim.Optimizer] | None:
        """The optimizers to capture through torch's base methods: a custom `state_dict` over no state yet; else None."""
        optimizers = _optimizers(self.obj)
        if not optimizers or not _own_state_dict(self.obj) or any(o.state for o in optimizers):
            return None
        return optimizers

    def state_dict(self) -> dict:
        unstepped = self._unstepped()
        if unstepped is None:
            return self.obj.state_dict()
        return {UNSTEPPED: [torch.optim.Optimizer.state_dict(o) for o in unstepped]}

    def load_state_dict(self, state: dict) -> None:
        if UNSTEPPED not in state:
            self.obj.load_state_dict(state)
            return
        optimizers = _optimizers(self.obj)
        if len(optimizers) != len(state[UNSTEPPED]):
            raise ValueError(f"the checkpoint holds {len(state[UNSTEPPED])} optimizers before their first step, this run {len(optimizers)}")
        for optimizer, saved in zip(optimizers, state[UNSTEPPED]):
            torch.optim.Optimizer.load_state_dict(optimizer, saved)
