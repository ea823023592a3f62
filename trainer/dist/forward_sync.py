"""DDP's forward-sync flag as state: whether the next forward broadcasts rank 0's buffers over every rank's own.

`DistributedDataParallel` with `broadcast_buffers=True` (its default) copies
rank 0's buffers (BatchNorm statistics) to every rank before a forward, but
only when its flag `require_forward_param_sync` is set. The previous forward
leaves that flag: a forward with gradients and gradient sync on sets it, one
under `no_sync()` or `torch.no_grad()` (an accumulation micro-step, a
validation pass) clears it. It is process state outside DDP's `state_dict`,
and a fresh process starts with it set: a resume whose next forward follows a
`no_sync` micro-step, or a script that validates before its loop, would
broadcast where the uninterrupted run did not, and every rank's buffers (and
an EMA of them) would part from the run.

`ForwardSync` is the state component for it, per rank. It must never run a
forward pass or a collective, and never touch a model that is not DDP.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

FLAG = "require_forward_param_sync"


class ForwardSync:
    """DDP's `require_forward_param_sync` as a `Stateful` (None for a model without a DDP wrapper)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.ddp = model if isinstance(model, DDP) else None

    def state_dict(self) -> dict:
        """Whether DDP's next forward broadcasts the buffers (None: no DDP wrapper)."""
        return {FLAG: None if self.ddp is None else bool(getattr(self.ddp, FLAG))}

    def load_state_dict(self, state: dict) -> None:
        """Leave the flag as the run had it after the saved step."""
        if self.ddp is not None and state[FLAG] is not None:
            setattr(self.ddp, FLAG, bool(state[FLAG]))
