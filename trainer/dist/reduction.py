"""Gradient reduction order: a resumed attempt reduces with the bucket layout the uninterrupted run had, which is DDP's own.

With 3 or more ranks the bits of an all-reduced gradient depend on where each
element sits in the flat buffer that is reduced (the ring algorithm sums each
chunk of the buffer starting at another rank). DDP packs gradients into
buckets twice in every process: at construction (one bucket, or parameters
in reverse order under `find_unused_parameters`) and again at the first
forward after the first synchronised backward pass, in the order the
gradients became ready. A fresh process therefore reduces its first step
with the construction layout, where the uninterrupted run had long rebuilt:
a resume parts from it at the first resumed step.

`BucketLayout` is the state component for it. A run that is never resumed is
left exactly as the plain DDP loop has it. Its state is the layout the next
step reduces with: None while DDP still has its construction layout, else the
rebuilt buckets as parameter indices, read from DDP's reducer (the pending
rebuild is done at the capture, as the next forward would do it, with the
same layout). Restoring a layout hands DDP a reducer built with it as its
construction layout, through DDP's own reducer construction (the path DDP
takes when it is unpickled), after removing the old reducer's hooks (the path
elastic recovery takes). That reducer rebuilds after its first backward pass
in the same gradient-ready order, to the same layout. It never runs a forward
or backward pass, never draws random numbers and never changes parameters.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger(__name__)

CONSTRUCTION = None  # the state of a DDP model that has not rebuilt its buckets: a fresh process has the same layout


@dataclass(frozen=True)
class Restoring:
    """Whether a resumed attempt reduces with the layout the run had, and why (for logs, events and tests)."""

    restored: bool
    reason: str


def unsupported(model: torch.nn.Module) -> str | None:
    """Why `model`'s layout cannot be restored (None when it can, or when there is nothing to restore)."""
    if not isinstance(model, DDP):
        return None
    if getattr(model, "_use_python_reducer", False):
        return "python reducer (compiled autograd)"
    if getattr(model, "mixed_precision", None) is not None:
        return "DDP mixed_precision"
    if model.static_graph:
        return "static_graph"
    return None


def restoring(model: torch.nn.Module, resumed: bool, skipped: bool) -> Restoring:
    """What an attempt does with the layout: a fresh start keeps DDP's own, a resume restores the run's (`skipped`: chaos)."""
    if not isinstance(model, DDP):
        return Restoring(False, "not DistributedDataParallel: no buckets to restore")
    reason = unsupported(model)
    if reason is not None:
        return Restoring(False, reason)
    if not resumed:
        return Restoring(True, "fresh start: DDP's own layout, as in the plain loop")
    if skipped:
        return Restoring(False, "chaos: DDP's own layout")
    return Restoring(True, "the run's layout restored")


class BucketLayout:
    """The gradient bucket layout of a DDP model as a `Stateful`: saved with every checkpoint, restored on resume."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.ddp = model if isinstance(model, DDP) else None
        self._rebuilt: list[list[int]] | None = None  # read once: DDP rebuilds its buckets once per process
        self._installed: list[list[int]] | None = CONSTRUCTION

    def state_dict(self) -> dict:
        """The layout the next step reduces with: None (DDP's construction layout) or the buckets as parameter indices."""
        return {"buckets": self.current()}

    def load_state_dict(self, state: dict) -> None:
        """Give the DDP model the saved layout before its first forward pass; a construction layout is left as it is."""
        layout = state["buckets"]
        if self.ddp is None or layout == self.current():
            return
        reason = unsupported(self.ddp)
        if reason is not None:
            log.warning(
                "The checkpoint's gradient bucket layout cannot be given to this DistributedDataParallel model (%s): with 3 or more "
                "ranks the resumed run may differ in the last bits from the uninterrupted one from the first resumed step. "
                "Check the run with `legato verify`.", reason
            )
            return
        _install(self.ddp, layout)
        self._installed, self._rebuilt = layout, None

    def current(self) -> list[list[int]] | None:
        """The layout the next step reduces with (rebuilding now when DDP's next forward would rebuild)."""
        if self.ddp is None or unsupported(self.ddp) is not None:
            return CONSTRUCTION
        if self._rebuilt is not None:
            return self._rebuilt
        if self.ddp.reducer._rebuild_buckets():
            # What DDP's next forward does (a no-op for it now), done here so the layout can be read.
            self.ddp._has_rebuilt_buckets = True
        if getattr(self.ddp, "_has_rebuilt_buckets", False):
            self._rebuilt = _read(self.ddp)
            return self._rebuilt
        return self._installed


def _read(ddp: DDP) -> list[list[int]]:
    """The reducer's buckets as indices into the parameters DDP gave it."""
    parameters, _ = ddp._build_params_for_reducer()
    index = {id(p): i for i, p in enumerate(parameters)}
    return [[index[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def _install(ddp: DDP, layout: list[list[int]] | None) -> None:
    """Replace `ddp`'s reducer by one whose construction layout is `layout` (None: DDP's own)."""
    parameters, expect_sparse = ddp._build_params_for_reducer()
    names = ddp._build_debug_param_to_name_mapping(parameters)
    ddp.reducer._remove_autograd_hooks()
    with _assignment(layout, ddp):
        ddp._ddp_init_helper(parameters, expect_sparse, names, ddp.static_graph)
    for hook, state in getattr(ddp, "_comm_hooks", []):
        dist._register_comm_hook(ddp.reducer, state, hook)
    ddp._has_rebuilt_buckets = False


@contextlib.contextmanager
def _assignment(layout: list[list[int]] | None, ddp: DDP) -> Iterator[None]:
    """While DDP builds its reducer, its bucket assignment is `layout` (DDP reverses the list it computes; so do we)."""
    if layout is None:
        yield
        return
    own = dist._compute_bucket_assignment_by_size
    config = getattr(ddp, "_bucket_config", None)
    first = getattr(config, "first_bucket_bytes_cap", dist._DEFAULT_FIRST_BUCKET_BYTES)
    limits = [first] + [ddp.bucket_bytes_cap] * (len(layout) - 1)
    dist._compute_bucket_assignment_by_size = lambda *args, **kwargs: (list(reversed(layout)), list(reversed(limits)))
    try:
        yield
    finally:
        dist._compute_bucket_assignment_by_size = own
