"""Bring your own loader and own state, in one process: what legato refuses and what it restores.

Loaders legato cannot resume exactly are refused before training, in one
paragraph naming the fix; RNG objects and a carried batch registered as extras
restore exactly; a DataLoader(shuffle=True) seeded from the global RNG keeps its
order and resumes mid-epoch; worker seeding wraps the user's worker_init_fn.
The same loops with 2 real ranks and real signals: e2e/test_byo_loader_runs.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import files_under, fit_run, fit_step
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

import legato


class Unordered(Sampler[int]):
    """A sampler whose order depends on how often it was iterated: nothing legato can replay."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __iter__(self):
        self.calls += 1
        return iter(range(self.calls % self.n, self.n))

    def __len__(self) -> int:
        return self.n


class Pairs(Sampler[list[int]]):
    def __iter__(self):
        return iter([[0, 1], [2, 3]])

    def __len__(self) -> int:
        return 2


class Stateless(IterableDataset):
    def __iter__(self):
        return iter(range(8))


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(16.0).unsqueeze(1))


REFUSED = {
    "sampler": (lambda: DataLoader(_dataset(), batch_size=2, sampler=Unordered(16)), "has no set_epoch(epoch)"),
    "batch_sampler": (lambda: DataLoader(_dataset(), batch_sampler=Pairs()), "its own batch_sampler (Pairs)"),
    "iterable": (lambda: DataLoader(Stateless(), batch_size=2), "has no state_dict()/load_state_dict()"),
    "persistent_iterable": (
        lambda: DataLoader(Stateless(), batch_size=2, num_workers=1, persistent_workers=True),
        "persistent_workers=True, and it reads an IterableDataset (Stateless)",
    ),
    "persistent_stateful": (lambda: _shuffled_loader(_dataset(), "stateful-persistent"), "and it is a StatefulDataLoader"),
    "persistent_set_epoch": (
        lambda: DataLoader(_Curriculum(), batch_size=2, num_workers=1, persistent_workers=True),
        "reads a dataset with set_epoch() (_Curriculum), which never reaches persistent workers",
    ),
    "resumable_persistent": (
        lambda: legato.resumable_loader(_dataset(), batch_size=2, seed=0, num_workers=1, persistent_workers=True),
        "sets persistent_workers itself",
    ),
    "out_of_order": (lambda: DataLoader(_dataset(), batch_size=2, num_workers=1, in_order=False), "in_order=False"),
    "not_a_loader": (lambda: [torch.zeros(2)], "is not a torch DataLoader"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_loader_legato_cannot_resume_is_refused_before_training(tmp_path: Path, case: str) -> None:
    build, words = REFUSED[case]
    model = torch.nn.Linear(1, 1)
    with pytest.raises(legato.UsageError) as caught:
        legato.Session(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=build(), total_steps=4)
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert not (tmp_path / "checkpoints").exists()


def _session(run_dir: Path, **kwargs) -> legato.Session:
    model = torch.nn.Linear(2, 1)
    kwargs.setdefault("total_steps", 4)
    return legato.Session(run_dir, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_rng_objects_are_extras_as_they_are_and_restore_exactly(tmp_path: Path) -> None:
    import random

    import numpy as np

    from legato.state.owned import as_stateful

    for obj, draw in (
        (torch.Generator().manual_seed(1), lambda g: torch.rand(3, generator=g).tolist()),
        (np.random.default_rng(2), lambda g: g.normal(size=3).tolist()),
        (random.Random(3), lambda g: [g.random() for _ in range(3)]),
    ):
        state = as_stateful("extra.x", obj)
        saved = torch.load(_roundtrip(tmp_path, state.state_dict()), weights_only=True)
        expected = draw(obj)
        state.load_state_dict(saved)
        assert draw(obj) == expected
    with pytest.raises(legato.UsageError, match="no state_dict"):
        as_stateful("extra.x", object())


def _roundtrip(tmp_path: Path, state: dict) -> Path:
    path = tmp_path / "state.pt"
    torch.save(state, path)
    return path


def test_a_carried_batch_is_restored_into_its_tensors_and_another_shape_is_refused(tmp_path: Path) -> None:
    no_replay = legato.CheckpointPolicy(replay_steps=0)
    session = _session(tmp_path, chaos=legato.Chaos(signal_at_steps=(2,)), checkpoint=no_replay)
    session.carry(torch.zeros(3, 2))
    for step in session:
        session.carry(torch.full((3, 2), float(step + 1)))
    assert session.exit_code == 75
    again = _session(tmp_path, checkpoint=no_replay)
    held = again.carry(torch.zeros(3, 2))
    for _ in again:
        break
    assert torch.equal(held, torch.full((3, 2), 2.0)), "the batch carried out of step 2, copied into the loop's own tensor"
    other = _session(tmp_path, checkpoint=no_replay)
    other.carry(torch.zeros(4, 2))
    with pytest.raises(legato.UsageError, match="shapes and dtypes"):
        for _ in other:
            break


def _carried_batch(step: int) -> dict:
    return {"x": torch.full((3, 2), float(step)), "ids": [f"doc{step}", f"doc{step + 100}"], "tokens": 10 * step, "pair": (step, None)}


def test_a_carried_batchs_plain_values_are_restored_into_its_dicts_and_lists_and_one_in_a_tuple_is_verified(tmp_path: Path) -> None:
    """Ids and a token count beside the tensors: they were not saved, and the first resumed step went on with the values of
    the batch carried before the loop while the resume said verified. A value in a tuple cannot be written back: when it
    differs the resume fails on `carried` instead."""
    no_replay = legato.CheckpointPolicy(replay_steps=0)
    session = _session(tmp_path, chaos=legato.Chaos(signal_at_steps=(2,)), checkpoint=no_replay)
    session.carry(_carried_batch(0))
    for step in session:
        session.carry(_carried_batch(step + 1))
    assert session.exit_code == 75
    again = _session(tmp_path, checkpoint=no_replay)
    held = again.carry({**_carried_batch(0), "pair": (2, None)})  # the tuple holds what was carried out of step 2
    for _ in again:
        break
    assert held["ids"] == ["doc2", "doc102"] and held["tokens"] == 20 and torch.equal(held["x"], torch.full((3, 2), 2.0)), held
    differs = _session(tmp_path, checkpoint=no_replay)
    differs.carry(_carried_batch(0))
    with pytest.raises(legato.ResumeMismatchError, match="Differing components: rank 0: carried"):
        for _ in differs:
            break


@pytest.mark.parametrize(
    ("leaf", "named"),
    [
        (np.zeros(3), "a numpy.ndarray"),
        (Path("x"), "a pathlib.PosixPath"),
        (np.float64(0.5), "a numpy.float64"),  # a float subclass, but saved as a numpy object no weights-only load takes back
    ],
)
def test_a_carried_batch_with_a_leaf_legato_cannot_save_is_refused_when_carried(tmp_path: Path, leaf: object, named: str) -> None:
    session = _session(tmp_path)
    with pytest.raises(legato.UsageError, match=f"session.carry\\(\\) got a batch holding {named}, which legato can neither save"):
        session.carry({"x": torch.zeros(2), "extra": [leaf]})


def test_misuse_is_refused_in_one_paragraph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(legato.UsageError, match="exactly one of total_steps= and total_epochs="):
        _session(tmp_path, total_steps=None)
    monkeypatch.setenv("LEGATO_CHAOS_SIGNAL_AT", "3,x")
    with pytest.raises(legato.UsageError, match="LEGATO_CHAOS_SIGNAL_AT"):
        _session(tmp_path)
    monkeypatch.delenv("LEGATO_CHAOS_SIGNAL_AT")
    session = _session(tmp_path)
    with pytest.raises(legato.UsageError, match="inside `for epoch in session.epochs"):
        next(iter(session.batches()))
    late = _session(tmp_path / "late")
    with pytest.raises(legato.UsageError, match="first called inside the loop"):
        for _ in late:
            late.carry(torch.zeros(1))


def _shuffled_run(run_dir: Path | None, stop_after: int | None = None, kind: str = "torch", replay_steps: int = 0) -> list[str]:
    """A loop over DataLoader(shuffle=True) (RandomSampler seeded from the global RNG as each epoch starts) and dropout;
    with `run_dir` None the plain loop, else the Session's. Returns every step's loss bits. `kind`: "torch", or torchdata's
    StatefulDataLoader with shuffle=True ("stateful": its own RandomSampler, seeded once from the global RNG) or with torch's
    RandomSampler ("stateful-torch-sampler")."""
    torch.manual_seed(0)
    data = TensorDataset(
        torch.randn(40, 3, generator=torch.Generator().manual_seed(1)), torch.randn(40, 1, generator=torch.Generator().manual_seed(2))
    )
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = _shuffled_loader(data, kind)
    losses = []

    def train(batch: list[torch.Tensor]) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
        return loss

    if run_dir is None:
        for _ in range(3):
            for batch in loader:
                train(batch)
        return losses
    chaos = legato.Chaos(signal_at_steps=(stop_after,)) if stop_after else legato.Chaos()
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        loader=loader,
        total_epochs=3,
        chaos=chaos,
        checkpoint=legato.CheckpointPolicy(replay_steps=replay_steps, replay_cost=0),
    )
    for batch in session:
        session.report(train(batch))
    return losses


def _shuffled_loader(data: TensorDataset, kind: str) -> DataLoader:
    """`kind`, and "-persistent" after it: one worker that lives from the first epoch to the last."""
    kind, persistent = kind.removesuffix("-persistent"), kind.endswith("-persistent")
    workers = {"num_workers": 1, "persistent_workers": True} if persistent else {}
    if kind == "torch":
        return DataLoader(data, batch_size=4, shuffle=True, **workers)
    from torchdata.stateful_dataloader import StatefulDataLoader

    if kind == "stateful":
        return StatefulDataLoader(data, batch_size=4, shuffle=True, **workers)
    return StatefulDataLoader(data, batch_size=4, sampler=torch.utils.data.RandomSampler(data), **workers)


@pytest.mark.parametrize("kind", ["torch", "stateful", "stateful-torch-sampler"])
def test_a_random_sampler_seeded_from_the_global_rng_keeps_its_order_and_resumes_mid_epoch(tmp_path: Path, kind: str) -> None:
    """The epoch's opening (the iterator's base seed, then RandomSampler's seed, both from the global RNG) is replayed
    from the state recorded when the epoch opened; the consumed batches are skipped by index. Also for torchdata's
    StatefulDataLoader, whose total_epochs= comes from len(loader)."""
    plain = _shuffled_run(None, kind=kind)
    assert _shuffled_run(tmp_path / "same", kind=kind) == plain
    first = _shuffled_run(tmp_path / "resumed", stop_after=14, kind=kind)  # epoch 1, batch 4 of 10
    rest = _shuffled_run(tmp_path / "resumed", kind=kind)
    assert first + rest == plain


def test_persistent_workers_resume_mid_epoch_and_at_an_epoch_boundary(tmp_path: Path) -> None:
    """The loader draws its worker's base seed from the global RNG once, as the first epoch opens, and only the sampler's
    seed at later openings; the resumed process starts its worker from the first opening's states, loading nothing, then
    replays its epoch's opening. Stops in epoch 0 at batch 4 of 10 (step 4: the opening that started the worker is
    replayed as it was), in epoch 1 at batch 4 (step 14) and after its last batch (step 20); and at step 14 with a replay
    from step 8, whose base lies in epoch 0."""
    kind = "torch-persistent"
    plain = _shuffled_run(None, kind=kind)
    assert plain != _shuffled_run(None, kind="torch"), "persistence changes what the global RNG gives"
    assert _shuffled_run(tmp_path / "same", kind=kind) == plain
    for stop in (4, 14, 20):
        first = _shuffled_run(tmp_path / f"stop{stop}", stop_after=stop, kind=kind)
        rest = _shuffled_run(tmp_path / f"stop{stop}", kind=kind)
        assert first + rest == plain, stop
    _shuffled_run(tmp_path / "replayed", stop_after=14, kind=kind, replay_steps=8)
    replayed_and_rest = _shuffled_run(tmp_path / "replayed", kind=kind, replay_steps=8)
    assert replayed_and_rest == plain[8:], "steps 9..14 replayed from the base at step 8, then the rest"


def test_a_resume_that_started_persistent_workers_at_its_own_opening_would_diverge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted fault: without `_start_workers` the resumed loader draws a base seed where the plain loop drew none."""
    from legato.state.loaders import TorchSource

    plain = _shuffled_run(None, kind="torch-persistent")
    first = _shuffled_run(tmp_path, stop_after=14, kind="torch-persistent")
    monkeypatch.setattr(TorchSource, "_start_workers", lambda self, epoch: None)
    assert first + _shuffled_run(tmp_path, kind="torch-persistent") != plain


def test_a_resume_that_changes_persistent_workers_is_refused(tmp_path: Path) -> None:
    _shuffled_run(tmp_path, stop_after=14, kind="torch")
    with pytest.raises(legato.UsageError, match=r"persistent_workers=False, this one has persistent_workers=True") as caught:
        _shuffled_run(tmp_path, kind="torch-persistent")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("kind", ["legato", "torch"])
def test_a_dataset_grown_since_the_checkpoint_is_named_on_resume_even_with_the_replay_off(tmp_path: Path, kind: str) -> None:
    """40 samples, stopped mid-epoch; the same script over 48 samples draws the epoch's order over 48, so it would train on
    other batches (before the data position held the size, it did so with no error: the counters agreed, and with the
    replay off nothing compared a batch). The resume names both sizes, harms no file, and the run goes on over its 40."""

    def launch(samples: int, total_steps: int) -> legato.Session:
        data = TensorDataset(torch.randn(samples, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(samples, 1))
        loader = (
            legato.resumable_loader(data, batch_size=4, seed=1)
            if kind == "legato"
            else DataLoader(data, batch_size=4, shuffle=True, drop_last=True)
        )
        return fit_run(tmp_path, loader, total_steps, features=3)

    launch(40, 6)
    before = files_under(tmp_path / "checkpoints")
    with pytest.raises(legato.UsageError) as refused:
        launch(48, 12)
    said = str(refused.value)
    assert "saved over a dataset of 40 samples; this run's dataset has 48" in said and "\n" not in said, said
    assert files_under(tmp_path / "checkpoints") == before
    assert launch(40, 12).step == 12


class _Curriculum(torch.utils.data.Dataset):
    """A dataset whose samples follow the epoch the loop sets on it (`set_epoch`), read by the workers' copies."""

    def __init__(self) -> None:
        self.epoch = 0
        self.x = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] * (1 + self.epoch), self.x[i].sum(0, keepdim=True)


def _curriculum_run(run_dir: Path, stop_after: int | None = None, replay_steps: int = 0) -> list[str]:
    """The loop sets the dataset's epoch first thing in each epoch, then trains on one worker's batches; its loss bits."""
    torch.manual_seed(0)
    dataset = _Curriculum()
    loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    chaos = legato.Chaos(signal_at_steps=(stop_after,)) if stop_after else legato.Chaos()
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        loader=loader,
        total_epochs=3,
        chaos=chaos,
        checkpoint=legato.CheckpointPolicy(replay_steps=replay_steps, replay_cost=0),
    )
    losses = []
    for epoch in session.epochs():
        dataset.set_epoch(epoch)
        for x, y in session.batches():
            loss = fit_step(model, optimizer, x, y)
            losses.append(loss.item().hex())
            session.report(loss)
    return losses


def test_a_resumed_epochs_workers_copy_the_dataset_after_the_loops_set_epoch(tmp_path: Path) -> None:
    """Stopped in epoch 1 at batch 4 of 10 (step 14): the resumed loop sets the dataset's epoch again before its first
    batch, and the epoch's iterator (whose worker copies the dataset) opens only then, as the interrupted one did after
    the same call. Resumed without a replay, and with one from a base in the same epoch (step 12)."""
    uninterrupted = _curriculum_run(tmp_path / "reference")
    for replay_steps in (0, 3):
        first = _curriculum_run(tmp_path / f"replay{replay_steps}", stop_after=14, replay_steps=replay_steps)
        rest = _curriculum_run(tmp_path / f"replay{replay_steps}", replay_steps=replay_steps)
        assert first + rest[-16:] == uninterrupted, replay_steps


def test_an_iterator_opened_at_the_restore_would_hand_the_workers_a_stale_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted fault: reopening the epoch at the restore, before the loop's set_epoch, diverges while the resume
    (without a replay: verified by its digests) says verified."""
    from legato.session.feed import Feed

    def at_the_restore(self: Feed) -> None:
        self.drop()
        if self.position.mid_epoch and self.source is not None:
            self._batches = self._open(resuming=True)

    uninterrupted = _curriculum_run(tmp_path / "reference")
    first = _curriculum_run(tmp_path / "resumed", stop_after=14)
    monkeypatch.setattr(Feed, "resumed", at_the_restore)
    assert first + _curriculum_run(tmp_path / "resumed") != uninterrupted


def test_a_stateful_dataloaders_own_state_does_not_resume_torchs_random_sampler_which_is_why_legato_positions_it() -> None:
    """The loader's own state holds how many batches were consumed, not the seed torch's RandomSampler drew from the global
    RNG as the epoch opened: restored with every RNG as the checkpoint saw it, it fast-forwards over another permutation.
    legato records the RNG at the opening and replays it (above), which is exact."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = TensorDataset(torch.arange(40.0))
    loader = StatefulDataLoader(data, batch_size=4, sampler=torch.utils.data.RandomSampler(data))
    batches = iter(loader)
    seen = [next(batches)[0].tolist() for _ in range(3)]
    state, at_checkpoint = loader.state_dict(), torch.get_rng_state()
    rest = [b[0].tolist() for b in batches]
    torch.set_rng_state(at_checkpoint)
    resumed = StatefulDataLoader(data, batch_size=4, sampler=torch.utils.data.RandomSampler(data))
    resumed.load_state_dict(state)
    again = [b[0].tolist() for b in resumed]
    assert sorted(x for b in seen + rest for x in b) == list(range(40))
    assert len(again) == len(rest) and again != rest


def test_worker_seeding_wraps_the_users_worker_init_fn_and_can_be_switched_off(tmp_path: Path) -> None:
    from legato.state.worker_rng import SeedPerSample

    def mine(worker_id: int) -> None:
        pass

    def loader() -> DataLoader:
        return DataLoader(_dataset(), batch_size=2, num_workers=1, worker_init_fn=mine)

    seeded = loader()
    session = _session(tmp_path / "on", loader=seeded)
    assert isinstance(seeded.worker_init_fn, SeedPerSample) and seeded.worker_init_fn.user_fn is mine
    assert session.source.state_dict(0, 0)["worker_seed"] == seeded.worker_init_fn.seed
    kept = loader()
    _session(tmp_path / "off", loader=kept, worker_rng=False)
    assert kept.worker_init_fn is mine


class _GlobalAugment(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[float, float, float]:
        import random

        import numpy as np

        return (torch.rand(1).item(), float(np.random.rand()), random.random())


def test_per_sample_seeding_makes_a_samples_randomness_independent_of_load_order() -> None:
    """What a worker does to its dataset copy, done here in-process (the global RNGs are put back afterwards)."""
    import numpy as np

    from legato.state import rng
    from legato.state.worker_rng import _reseeding

    saved = rng.capture()
    try:
        ds = _GlobalAugment()
        _reseeding(ds, seed=5, epoch=np.array(1))
        forward = [ds[i] for i in range(6)]
        backward = [ds[i] for i in reversed(range(6))][::-1]
        assert forward == backward
        other_epoch = _GlobalAugment()
        _reseeding(other_epoch, seed=5, epoch=np.array(2))
        assert [other_epoch[i] for i in range(6)] != forward
        plain = _GlobalAugment()
        assert [plain[i] for i in range(6)] != [plain[i] for i in range(6)], "the unseeded dataset is what the seeding fixes"
    finally:
        rng.restore(saved)


def test_persistent_workers_seed_each_sample_from_the_epoch_they_are_loading() -> None:
    """The epoch lives in memory shared with the workers: a persistent worker started in epoch 0 seeds epoch 1's samples
    with epoch 1, as the fresh workers of a non-persistent loader do."""
    from legato.state.worker_rng import SeedPerSample

    def epochs(persistent: bool) -> list[list[float]]:
        seeding = SeedPerSample(7, None)
        loader = DataLoader(_GlobalAugment(), batch_size=3, num_workers=2, worker_init_fn=seeding, persistent_workers=persistent)
        seen = []
        for epoch in range(2):
            seeding.epoch = epoch
            seen.append([x for batch in loader for column in batch for x in column.tolist()])
        return seen

    persistent = epochs(True)
    assert persistent == epochs(False)
    assert persistent[0] != persistent[1]


class _Counted(torch.utils.data.Sampler[int]):
    """A sampler that records every set_epoch call (its order does not depend on it)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch, self.calls = n, 0, []

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def test_legato_calls_set_epoch_on_nothing_of_the_users(tmp_path: Path) -> None:
    """The flat form over 3 epochs is the plain loop's cycle(dl): nobody calls set_epoch, so neither does the Session."""
    sampler = _Counted(8)
    loader = DataLoader(_dataset(), batch_size=2, sampler=sampler)
    session = _session(tmp_path, loader=loader, total_steps=None, total_epochs=3, checkpoint=legato.CheckpointPolicy(replay_steps=0))
    assert sum(1 for _ in session) == 12 and session.epoch == 3
    assert sampler.calls == []


class _LyingLength(IterableDataset):
    """Six samples and a position of its own, but a __len__ that says eight."""

    def __init__(self) -> None:
        self.position = 0

    def __len__(self) -> int:
        return 8

    def __iter__(self):
        while self.position < 6:
            self.position += 1
            yield torch.tensor([float(self.position)])
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def test_total_epochs_counts_with_len_and_an_epoch_of_another_length_stops_the_run(tmp_path: Path) -> None:
    from legato.state.loaders import StatefulSource

    loader = DataLoader(_LyingLength(), batch_size=2)
    session = _session(tmp_path, loader=loader, total_steps=None, total_epochs=2, checkpoint=legato.CheckpointPolicy(replay_steps=0))
    assert isinstance(session.source, StatefulSource) and session.total_steps == 8
    with pytest.raises(legato.UsageError, match="ended after 3 batches, but len\\(loader\\) is 4") as caught:
        for _ in session:
            pass
    assert "\n" not in str(caught.value)


def _late_set_epoch_run(run_dir: Path | None, stop_after: int | None = None) -> list[list[float]]:
    """A loop that calls sampler.set_epoch(epoch + 1) after each epoch's batches (a DistributedSampler of one replica);
    with `run_dir` None the plain loop. Returns every batch it saw."""
    from torch.utils.data.distributed import DistributedSampler

    data = _dataset()
    sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=4)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    if run_dir is None:
        seen = []
        for epoch in range(3):
            seen += [b[0].flatten().tolist() for b in loader]
            sampler.set_epoch(epoch + 1)
        return seen
    chaos = legato.Chaos(signal_at_steps=(stop_after,)) if stop_after else legato.Chaos()
    session = _session(
        run_dir, loader=loader, total_steps=None, total_epochs=3, chaos=chaos, checkpoint=legato.CheckpointPolicy(replay_steps=0)
    )
    seen = []
    for epoch in session.epochs():
        seen += [b[0].flatten().tolist() for b in session.batches()]
        sampler.set_epoch(epoch + 1)
    return seen


def test_a_resume_puts_back_the_epoch_the_sampler_had_when_the_interrupted_epoch_opened(tmp_path: Path) -> None:
    plain = _late_set_epoch_run(None)
    assert plain[:4] != plain[4:8], "each epoch has its own order"
    first = _late_set_epoch_run(tmp_path, stop_after=6)  # epoch 1, batch 2 of 4: a fresh sampler would say epoch 0
    rest = _late_set_epoch_run(tmp_path)
    assert first + rest == plain
