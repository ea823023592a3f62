"""What a script hands its Session, checked before anything is written: one paragraph per mistake, never an AttributeError.

A run directory it can write, a model, an optimizer, a scheduler and scaler that are torch `Stateful`s, a run length
that is a positive whole number, and a reported loss that is one number; `CheckpointPolicy` and `StopPolicy` check
their own fields as they are made (legato.session.policy). The run directory's rule is the config's `run.dir` rule
(legato.config_checks), written once. This module must never create or touch anything: it only looks.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any

import torch

from legato.config_build import STEPS_MAX, show, whole_number
from legato.config_checks import run_dir_problem
from legato.errors import UsageError
from legato.state.components import check_stateful

_EXAMPLE_LENGTH = {"total_steps": 10_000, "total_epochs": 90}


def check_arguments(run_dir: str | Path, model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> None:
    """A UsageError naming the first argument a Session cannot work with, and what to pass instead."""
    is_path = isinstance(run_dir, (str, os.PathLike))
    problem = run_dir_problem(Path(run_dir)) if is_path else f"is of type {type(run_dir).__name__}, not a path"
    if problem:
        raise UsageError(
            f'Session: run_dir {show(str(run_dir), 300)} {problem}. Pass a directory you can write (it is created), such as "runs/exp1".'
        )
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"Session: model= is a {type(model).__name__}, not a torch.nn.Module. Pass the model you train (the "
            "DistributedDataParallel wrapper, or the fully_shard-ed module)."
        )
    if not hasattr(optimizer, "param_groups"):
        raise UsageError(
            f"Session: optimizer= is a {type(optimizer).__name__}, not a torch optimizer (it has no param_groups). Pass the "
            "optimizer that steps the model, such as torch.optim.AdamW(model.parameters())."
        )
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if obj is not None:
            check_stateful(name, obj)


def total_steps_of(total_steps: Any, total_epochs: Any, steps_per_epoch: int | None) -> int:
    """The run's length in steps, from exactly one of total_steps= and total_epochs=."""
    if (total_steps is None) == (total_epochs is None):
        raise UsageError("The Session needs exactly one of total_steps= and total_epochs=, to know when the run is done. Pass one of them.")
    if total_steps is not None:
        return _run_length("total_steps", total_steps)
    if steps_per_epoch is None:
        raise UsageError("total_epochs= needs a loader whose length is known (len(loader)); with this loader pass total_steps= instead.")
    return _run_length("total_epochs", total_epochs) * steps_per_epoch


def _run_length(name: str, value: Any) -> int:
    """A count the caller passed: a positive whole number (a numpy integer too), or a UsageError naming it; a run of 0
    or -5 steps would end at once with exit 0, as if it had trained."""
    count = whole_number(value)
    if count is None or not 1 <= count <= STEPS_MAX:
        raise UsageError(
            f"Session: {name}={show(value)} is not a run length. Pass a positive whole number of at most {STEPS_MAX:,}, "
            f"such as {name}={_EXAMPLE_LENGTH[name]}."
        )
    return count


def refuse_late_carry(begun: bool, carrying: bool) -> None:
    """A batch first carried inside the loop is in no checkpoint before it: refused, with the fix."""
    if begun and not carrying:
        raise UsageError(
            "session.carry() was first called inside the loop, so the batch it holds is not in the checkpoints. Call "
            "it once before the loop too, with the first prefetched batch: X, Y = session.carry(get_batch())."
        )


def refuse_second_loop(begun: bool, step: int) -> None:
    """A Session runs one loop: iterating it again would open a second attempt in the same process."""
    if begun:
        raise UsageError(
            f"This Session's loop already ran (it ended at step {step}), and a Session runs one loop: its process "
            "group and checkpoints are closed. To train on, make a new Session with the same run directory; it "
            "resumes from the newest checkpoint."
        )


def check_batches(epoch_mode: bool, loader: Any, own_loader: Any) -> None:
    """session.batches(loader) is the epoch's part of `for epoch in session.epochs():`, over the Session's own loader."""
    if not epoch_mode:
        raise UsageError(
            "session.batches() runs inside `for epoch in session.epochs():`. Iterate the session itself for a loop without epochs."
        )
    if own_loader is None:
        raise UsageError("session.batches() needs a loader: pass loader= to the Session, or iterate the session itself.")
    if loader is not None and loader is not own_loader:
        raise UsageError("session.batches(loader) was given another loader than the Session's. Pass the Session the loader you iterate.")


def checked_loss(loss: Any) -> torch.Tensor | float:
    """A reported loss as it is (a one-element real tensor) or as a float (a real number), or a UsageError saying what to
    report. The tensor is not read here: that waits for the device (legato.session.losses)."""
    if type(loss) is float:  # every step of a loop that reports loss.item(): no generic checks
        return loss
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and not loss.is_complex():
        return loss
    if isinstance(loss, numbers.Real) and not isinstance(loss, bool):
        return float(loss)
    shown = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
    raise UsageError(
        f"session.report() takes the step's loss as one number (a one-element tensor or a float), not {shown}. Pass "
        "the scalar loss you call backward() on: session.report(loss)."
    )
