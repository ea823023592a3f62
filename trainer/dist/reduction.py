"""Gradient reduction order: the same DDP bucket layout in every attempt, so a resumed run sums like the first.

With 3 or more ranks the bits of an all-reduced gradient depend on where each
element sits in the flat buffer that is reduced (the ring algorithm sums each
chunk of the buffer starting at another rank). DDP packs gradients into
buckets twice in every process: at construction (parameters in reverse
order, one bucket when `find_unused_parameters` is off) and again after the
first backward pass (in the order the gradients became ready). So the first
step of every attempt reduces with one layout and the rest with another: a
resumed run's first step sums in another order than the same step of the
uninterrupted run did, and the runs part there.

`pin_bucket_layout` hands DDP's reducer every parameter in index order before
the first forward pass (the same call DDP's own `Join` uses when a rank has no
ready order to offer), so the rebuild happens at the first forward and every
step of every attempt reduces with one layout, a pure function of the model.
It never runs a forward or backward pass, never draws random numbers and
never changes parameters or gradients.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pinning:
    """What `pin_bucket_layout` did, and why (for logs and tests)."""

    pinned: bool
    reason: str


def pin_bucket_layout(model: torch.nn.Module) -> Pinning:
    """Make `model`'s DDP gradient buckets the same in every attempt; call before its first forward pass."""
    if not isinstance(model, DDP):
        return Pinning(False, "not DistributedDataParallel: no buckets to pin")
    if getattr(model, "_use_python_reducer", False):
        log.warning(
            "This DistributedDataParallel model uses the Python reducer (compiled autograd), whose gradient reduction "
            "order legato cannot pin: with 3 or more ranks a resumed run may differ in the last bits from the "
            "uninterrupted one, starting at the first resumed step. Turn the Python reducer off for bitwise resumes, "
            "or check the run with `legato verify`."
        )
        return Pinning(False, "python reducer")
    if model.find_unused_parameters and not model.static_graph:
        # DDP never rebuilds these buckets: the construction layout holds in every attempt.
        return Pinning(False, "find_unused_parameters: layout never rebuilt")
    if getattr(model, "_has_rebuilt_buckets", False):
        log.warning(
            "The DistributedDataParallel model already ran a training step before the Session was created, so its "
            "gradient buckets were rebuilt in that step's order; resumes stay bitwise only if every attempt runs the "
            "same steps before the Session. Create the Session before the model's first forward pass."
        )
        return Pinning(False, "already rebuilt")
    model.reducer._push_all_rebuilt_params()
    return Pinning(True, "parameters in index order")
