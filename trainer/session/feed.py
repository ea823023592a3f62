"""The batches of a Session's loader, from where the run stands: one epoch's iterator at a time.

Opens an epoch's iterator lazily (after the RNG restore, exactly where the
uninterrupted run opened it), reopens it mid-epoch on a resume at the first
batch the loop asks for (after the loop's own epoch prelude, a dataset's
`set_epoch`, has run again, with the restored RNGs kept around the replayed
opening), and moves to the next epoch when one of unknown length runs out.
With no loader the step index stands in for the batch. This module must
never write the position except through `Position`'s methods, and never
touch the disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from legato.errors import UsageError
from legato.session.position import Position
from legato.state import rng

EPOCH_OVER = object()  # in epochs(): the epoch's iterator ran out (its length was unknown)


class Feed:
    """One rank's supply of batches from an adopted loader (`legato.state.loaders`), or the step index without one."""

    def __init__(self, source: Any, position: Position, epoch_length: int | None = None) -> None:
        self.source = source
        self.position = position
        # The batches an epoch must have where the run's length was counted in epochs (len(loader) x total_epochs).
        self.epoch_length = epoch_length
        self.epoch_mode = False
        self._batches: Iterator[Any] | None = None
        self._reopen = False  # a resume landed mid-epoch: the next iterator replays the interrupted epoch's opening

    def next(self) -> Any:
        """The next batch; EPOCH_OVER where an epoch of unknown length ended inside epochs()."""
        if self.source is None:
            return self.position.step
        if self._batches is None:
            self._batches = self._open(resuming=self._reopen)
            self._reopen = False
        try:
            return next(self._batches)
        except StopIteration:
            # An epoch of unknown length ended: the next one starts where the plain loop starts it.
            if self.position.step_in_epoch == 0:
                raise UsageError(
                    f"The loader yielded no batch in epoch {self.position.epoch}. Pass a loader that yields at least one batch per epoch."
                ) from None
            if self.epoch_length is not None and self.position.step_in_epoch != self.epoch_length:
                raise UsageError(
                    f"The loader's epoch {self.position.epoch} ended after {self.position.step_in_epoch} batches, but "
                    f"len(loader) is {self.epoch_length}, from which total_epochs= counted the run's steps. Give the "
                    "loader (or its dataset) a __len__ that matches what it yields, or pass total_steps= instead."
                ) from None
            if self.epoch_mode:
                self._batches = None
                return EPOCH_OVER
            self.position.next_epoch()
            self._batches = self._open(resuming=False)
            return next(self._batches)

    def resumed(self) -> None:
        """After a restore: mirror the uninterrupted run, which had this epoch's iterator open only mid-epoch.

        Either way the iterator opens at the first batch the loop asks for: after the loop's epoch prelude ran again, as
        the uninterrupted run's workers copied the dataset after it. Mid-epoch that opening is the interrupted one,
        replayed with the restored RNGs kept; at a boundary it is the next epoch's own, exactly as it was there.
        """
        self.drop()
        self._reopen = self.position.mid_epoch and self.source is not None

    def drop(self) -> None:
        """Let this epoch's iterator go with its workers, as the plain loop does when the epoch ends; persistent workers
        stay with their loader until `close`.

        The workers are shut down here rather than whenever the iterator is collected: a reference cycle can keep it
        past the interpreter's exit handlers, and multiprocessing's handler then joins workers that ignore SIGTERM
        (legato's worker setup keeps stop signals for the rank) forever.
        """
        batches, self._batches = self._batches, None
        self._reopen = False
        if self.source is not None and self.source.keeps_workers:
            return
        shutdown = getattr(batches, "_shutdown_workers", None)  # torch's and torchdata's multi-process iterators
        if shutdown is not None:
            shutdown()

    def close(self) -> None:
        """The Session ends: every worker goes, persistent ones included."""
        self.drop()
        if self.source is not None:
            self.source.close()

    def _open(self, resuming: bool) -> Iterator[Any]:
        if not resuming:
            return self.source.open(self.position.epoch, self.position.step_in_epoch, False)
        # The replayed opening draws from the RNG states the interrupted one saw; the restored ones stay for the step.
        restored = rng.capture(self.source.generators)
        try:
            return self.source.open(self.position.epoch, self.position.step_in_epoch, True)
        finally:
            rng.restore(restored, self.source.generators)
