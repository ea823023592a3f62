"""What torch wraps a user's model in, and what lies under: DDP and torch.compile, in either order.

`model=` is what the loop calls: `DDP(model)`, `torch.compile(DDP(model))` (torch's
recommended order) or `DDP(torch.compile(model))` (nanoGPT's). The Session saves the
module under both wrappers, so a checkpoint's keys are the user's own module's
whether it ran compiled or not (as DCP's state-dict helpers name them), finds the
DDP wrapper wherever it sits (its gradient-bucket layout is state), and records
whether any part of the model runs compiled (a compiled step and an eager step
differ in their bits, so a resume that switched is named by that, not guessed).

It must never import dynamo itself (a model that has a compiled wrapper has
imported it already), and never change the model.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def layers(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model`, then each module under DDP's and torch.compile's wrappers, outermost first."""
    compiled = sys.modules.get("torch._dynamo.eval_frame")
    while True:
        yield model
        if isinstance(model, DDP):
            model = model.module
        elif compiled is not None and isinstance(model, compiled.OptimizedModule):
            model = model._orig_mod
        else:
            return


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module under every wrapper: what the Session saves and hashes."""
    *_, module = layers(model)
    return module


def ddp_of(model: torch.nn.Module) -> torch.nn.Module:
    """The DistributedDataParallel wrapper in `model` (under torch.compile's, for one), else `model` itself."""
    return next((m for m in layers(model) if isinstance(m, DDP)), model)


def runs_compiled(model: torch.nn.Module) -> bool:
    """Whether `model` or any module in it runs under torch.compile: a wrapper, or compiled in place (`Module.compile()`)."""
    compiled = sys.modules.get("torch._dynamo.eval_frame")
    if compiled is None:
        return False
    return any(isinstance(m, compiled.OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
