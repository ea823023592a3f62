"""Where a run stands: step, epoch and step within the epoch, owned by one object that alone writes them.

The Session, the loader feed and the restored checkpoint move the position
only through `Position`'s methods; `Counters` and `DataPosition` are its two
rows in the component table (the step counter, and the data position that a
loader's sampler state continues from). This module must never touch the disk
or the process group, and never draw from an RNG.
"""

from __future__ import annotations

from typing import Any

from legato.session.losses import HeldLoss, Loss, number


class Position:
    """The step, the epoch and the step within it; the only writer of the three."""

    def __init__(self, steps_per_epoch: int | None) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0

    @property
    def epoch_complete(self) -> bool:
        """Whether this epoch's batches are all done (its length is known)."""
        return self.steps_per_epoch is not None and self.step_in_epoch >= self.steps_per_epoch

    @property
    def mid_epoch(self) -> bool:
        """Whether some but not all of this epoch's batches are done: its iterator was open."""
        return self.step_in_epoch > 0 and not self.epoch_complete

    def advance(self, epoch_mode: bool) -> bool:
        """One step done; True when it was the epoch's last. In epochs() the epoch moves on after the body (`next_epoch`)."""
        self.step += 1
        self.step_in_epoch += 1
        if self.steps_per_epoch is None or self.step_in_epoch != self.steps_per_epoch:
            return False
        if not epoch_mode:
            self.next_epoch()
        return True

    def next_epoch(self) -> None:
        """Start the next epoch at its first batch."""
        self.epoch, self.step_in_epoch = self.epoch + 1, 0

    def restore_step(self, step: int) -> None:
        """The step counter of a restored checkpoint."""
        self.step = step

    def seek(self, epoch: int, step_in_epoch: int) -> None:
        """The data position of a restored checkpoint."""
        self.epoch, self.step_in_epoch = epoch, step_in_epoch


class Counters:
    """The step counter as a Stateful; epoch and step-within-epoch belong to the data position."""

    def __init__(self, position: Position) -> None:
        self.position = position

    def state_dict(self) -> dict[str, int]:
        p = self.position
        return {"step": p.step, "epoch": p.epoch, "step_in_epoch": p.step_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.position.restore_step(state["step"])


class DataPosition:
    """Where the next batch comes from: the sampler's state as of the steps consumed, not prefetched.

    Left unrestored, the run starts over at epoch 0, position 0: a fresh process's position.
    """

    def __init__(self, position: Position, source: Any) -> None:
        self.position, self.source = position, source

    def state_dict(self) -> dict:
        p = self.position
        if self.source is None:
            return {"epoch": p.epoch, "step_in_epoch": p.step_in_epoch}
        return self.source.state_dict(p.epoch, p.step_in_epoch)

    def load_state_dict(self, state: dict) -> None:
        if self.source is None:
            self.position.seek(state["epoch"], state["step_in_epoch"])
            return
        self.position.seek(*self.source.load_state_dict(state))


class Metrics:
    """The running loss accumulators (a float sum is state too), summed in the order the losses were reported. A loss
    still on its device is summed once it is read back: reading `values` (every capture does) reads back the rest."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {"loss_sum": 0.0, "loss_count": 0}
        self._unsummed: list[Loss] = []

    @property
    def values(self) -> dict[str, Any]:
        """loss_sum and loss_count, over every loss reported so far."""
        self._sum(self._unsummed)
        return self._values

    def add(self, loss: Loss) -> None:
        """Count one step's loss (summed now when it is a number and nothing before it waits, else later, in order)."""
        if not self._unsummed and not isinstance(loss, HeldLoss):  # a number with nothing before it waiting: every step's case
            self._values["loss_sum"] += number(loss)
            self._values["loss_count"] += 1
            return
        self._unsummed.append(loss)
        waiting = next((i for i, held in enumerate(self._unsummed) if isinstance(held, HeldLoss) and not held.read), None)
        self._sum(self._unsummed if waiting is None else self._unsummed[:waiting])

    def _sum(self, losses: list[Loss]) -> None:
        for loss in losses:
            self._values["loss_sum"] += number(loss)
            self._values["loss_count"] += 1
        del self._unsummed[: len(losses)]

    def state_dict(self) -> dict:
        return dict(self.values)

    def load_state_dict(self, state: dict) -> None:
        self._values, self._unsummed = dict(state), []
