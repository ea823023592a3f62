"""Reported losses (and a tensor learning rate) kept on their device until a number is needed, then read back together.

`float(loss)` after every step makes the host wait for the device at every
step, and a GPU loop loses the overlap of its next launches with this step's
kernels (the plain loop reads its loss only when it logs). `LossBook.take`
keeps a detached copy of a reported tensor instead (the loop may write into
its own). A CPU tensor is read at once (READ_CPU_AT_ONCE): reading it waits
for nothing, and every held loss lives until its read-back, about a second of
steps, long enough for the garbage collector to walk it again and again (at
1 rank with a trivial step, 18 µs of a step went there). The first time any
held value is asked for, `settle` reads back
every loss held so far, one transfer per device and dtype, and hands the
values over in the order they were reported. That happens at the capture of
every checkpoint, state hash and replay base (`Metrics` folds its sum there),
when the trajectory's lines are written (every FLUSH_INTERVAL_S), at a
progress report, and at every step of a replay, which compares the loss bits
at once. The values are exact: `tolist()` and `float()` both widen the
tensor's element to a double. This module must never change a loss's value,
never change the order in which the waiting code sees the values, and never
read back one loss at a time while others wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch

READ_CPU_AT_ONCE = True
"""Whether a CPU tensor's loss is read when it is reported instead of held (tests turn it off to hold CPU losses as a
GPU's are held)."""


class HeldLoss:
    """One step's reported loss: a number once read back (`value`), with the code that waits for that number."""

    __slots__ = ("_book", "_tensor", "_value", "_waiting")

    def __init__(self, book: LossBook, tensor: torch.Tensor) -> None:
        self._book = book
        self._tensor: torch.Tensor | None = tensor  # None once read back
        self._value: float | None = None
        self._waiting: list[Callable[[float], None]] | None = None  # made by the first `then`: most losses have none

    @property
    def value(self) -> float:
        """The loss as a float; asking for one unread reads back every held loss."""
        if self._value is None:
            self._book.settle()
        assert self._value is not None
        return self._value

    @property
    def read(self) -> bool:
        """Whether the value was read back."""
        return self._value is not None

    def hex(self) -> str:
        """`float.hex` of the value (the trajectory's and the replay's exact form)."""
        return self.value.hex()

    # A held loss stands for its own `float.hex` in a record (legato.store.trajectory calls what stands for a value):
    # one object a step, not a bound method per record.
    __call__ = hex

    def then(self, use: Callable[[float], None]) -> None:
        """Call `use` with the value when it is read back; at once if it was."""
        if self._value is not None:
            use(self._value)
        elif self._waiting is None:
            self._waiting = [use]
        else:
            self._waiting.append(use)

    def _read(self, value: float) -> None:
        self._value, self._tensor = value, None
        waiting, self._waiting = self._waiting or [], None
        for use in waiting:
            use(value)


Loss = float | HeldLoss


class HeldRate:
    """A learning rate held on its device as a loss is (a capturable optimizer's tensor): its float when called, as the
    trajectory's writer calls what stands for a value."""

    __slots__ = ("_held",)

    def __init__(self, held: HeldLoss) -> None:
        self._held = held

    def __call__(self) -> float:
        return self._held.value


Rate = float | HeldRate


class LossBook:
    """The losses reported since the last read-back."""

    def __init__(self) -> None:
        self._held: list[HeldLoss] = []

    def take(self, loss: torch.Tensor | float) -> Loss:
        """A reported loss as the Session keeps it: a number as it is, a tensor held on its device. A tensor subclass
        (a DTensor) is read back at once: stacking it could run collectives."""
        if type(loss) is not torch.Tensor:
            return float(loss)
        detached = loss.detach()
        if READ_CPU_AT_ONCE and detached.is_cpu:
            return float(detached.item())  # an integer tensor's loss is a float too, as read_back makes it
        held = HeldLoss(self, detached.clone() if detached.dim() == 0 else detached.reshape(()).clone())
        self._held.append(held)
        return held

    def rate(self, lr: torch.Tensor | float) -> Rate:
        """A param group's learning rate as the trajectory writes it: a float, or a tensor's value held and read back
        with the losses (from a copy: a scheduler writes into the tensor at every step)."""
        taken = self.take(lr)
        return HeldRate(taken) if isinstance(taken, HeldLoss) else taken

    def settle(self) -> None:
        """Read back every held loss and hand each value to what waits for it, in the order reported."""
        held, self._held = self._held, []
        # A loss is held until it is read back, so each held one still has its tensor.
        for loss, value in zip(held, read_back([cast(torch.Tensor, h._tensor) for h in held])):
            loss._read(value)


def read_back(tensors: list[torch.Tensor]) -> list[float]:
    """The values of one-element tensors, in order: one stack and one copy to the host per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    values: list[float] = [0.0] * len(tensors)
    for indices in groups.values():
        for i, value in zip(indices, torch.stack([tensors[i] for i in indices]).cpu().tolist()):
            values[i] = float(value)
    return values


def number(loss: Loss | None) -> float | None:
    """A kept loss as a float (None: no loss was reported)."""
    return loss.value if isinstance(loss, HeldLoss) else loss


def hex_of(loss: Loss | None) -> str | Callable[[], str] | None:
    """A kept loss's `float.hex`, or for one still held, the held loss itself, callable for it (written out later)."""
    if isinstance(loss, HeldLoss):
        return loss.hex() if loss.read else loss
    return None if loss is None else loss.hex()
