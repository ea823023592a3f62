"""legato.state.plain: plain Python objects a loop changes are found by their attributes, and registered as plain data.

Real objects in one process (a timm-style AverageMeter and best-checkpoint saver, a counter on a trainer); the same
with 2 real ranks, a real Session and real stops is e2e/test_timm_loop.py.
"""

from __future__ import annotations

import io
import sys

import pytest
import torch

import legato
from legato.errors import UsageError
from legato.state.plain import PLAIN, changed, fingerprints, short_name


class AverageMeter:
    """timm's meter: plain floats and an int."""

    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n
        self.avg = self.sum / self.count


class Saver:
    """timm's CheckpointSaver in brief: a list of (metric, path) and the best epoch, beside a model it holds."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.checkpoint_files, self.best_epoch, self.best_metric = model, [], None, None

    def save(self, epoch: int, metric: float) -> None:
        self.checkpoint_files.append((metric, f"checkpoint-{epoch}.pth"))
        if self.best_metric is None or metric > self.best_metric:
            self.best_epoch, self.best_metric = epoch, metric


class Trainer:
    def __init__(self) -> None:
        self.steps_done = 0
        self.name = "run"


class tqdm_like:  # noqa: N801 (a display object's class, planted under a display package's name below)
    def __init__(self) -> None:
        self.n = 0


tqdm_like.__module__ = "tqdm.std"


def looks(registered: list, change) -> list[str]:
    """The short names of the objects the two looks around `change()` find changed, from the caller's frame."""
    before = fingerprints(registered, sys._getframe(1))
    change()
    return sorted(short_name(f.where) for f in changed(before, fingerprints(registered, sys._getframe(1))) if f.kind == PLAIN)


def test_a_meter_a_saver_and_a_counter_that_change_are_named_and_nothing_else() -> None:
    model = torch.nn.Linear(2, 1)
    meter, saver, trainer, quiet, bar = AverageMeter(), Saver(model), Trainer(), AverageMeter(), tqdm_like()

    def train() -> None:
        meter.update(0.5)
        saver.save(1, 0.7)
        trainer.steps_done += 1
        bar.n += 1

    assert looks([model], train) == ["meter", "saver", "trainer"]
    assert quiet.count == 0  # unchanged: not named


def test_registered_objects_are_covered_and_the_planted_miss_is_caught() -> None:
    """The planted fault for the test above: the same change with the saver registered is not named, so a census that stopped
    looking at plain attributes would fail the test above."""
    saver, meter = Saver(torch.nn.Linear(2, 1)), AverageMeter()
    registered = [legato.attributes(saver), legato.attributes(meter)]
    assert looks(registered, lambda: (saver.save(1, 0.7), meter.update(1.0))) == []
    assert looks([], lambda: saver.save(2, 0.9)) == ["saver"]


def test_attributes_save_plain_data_and_load_it_back_bit_for_bit() -> None:
    saver = Saver(torch.nn.Linear(2, 1))
    saver.save(3, 0.1 + 0.2)
    state = legato.attributes(saver, "checkpoint_files", "best_epoch", "best_metric").state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # plain data: nothing pickled beyond what weights_only reads
    fresh = Saver(torch.nn.Linear(2, 1))
    legato.attributes(fresh, "checkpoint_files", "best_epoch", "best_metric").load_state_dict(loaded)
    assert fresh.best_metric.hex() == saver.best_metric.hex() and fresh.best_epoch == 3
    assert [tuple(x) for x in fresh.checkpoint_files] == saver.checkpoint_files
    assert set(legato.attributes(AverageMeter()).state_dict()) == {"val", "avg", "sum", "count"}


def test_attributes_refuse_what_is_not_plain_data_and_names_it_lacks() -> None:
    with pytest.raises(UsageError, match="has no attribute epochs"):
        legato.attributes(Saver(torch.nn.Linear(2, 1)), "epochs")
    with pytest.raises(UsageError, match="the Saver's model holds a Linear"):
        legato.attributes(Saver(torch.nn.Linear(2, 1)), "model").state_dict()
    with pytest.raises(UsageError, match="takes an object with attributes"):
        legato.attributes(3)


class Unprintable:
    """A dict key that fails when formatted: the look must place what it keys without calling its repr."""

    def __repr__(self) -> str:
        raise AssertionError("the look formatted a dict key")


def test_a_meter_under_a_key_that_is_no_literal_is_named_by_the_key_type_and_position() -> None:
    meters = {Unprintable(): AverageMeter(), Unprintable(): AverageMeter()}
    assert looks([], lambda: list(meters.values())[1].update(0.5)) == ["meters[<Unprintable #1>]"]
