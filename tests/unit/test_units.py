"""In-process tests of the core's building blocks: hashing, RNG capture, sampler, config."""

from __future__ import annotations

import io
import logging
import os
import random

import numpy as np
import pytest
import torch

from legato.config import load_config
from legato.errors import UsageError
from legato.state import rng
from legato.state.determinism import seed_everything
from legato.state.hashing import digest, global_hash, rank_hash
from legato.state.sampler import ResumableDistributedSampler, sample_generator


def test_digest_sees_every_bit_and_dtype() -> None:
    t = torch.arange(10, dtype=torch.float32)
    base = digest({"w": t})
    flipped = t.clone()
    flipped.view(torch.int32)[3] ^= 1  # lowest mantissa bit of one element
    assert digest({"w": flipped}) != base
    assert digest({"w": t.to(torch.float64)}) != base
    assert digest({"w": t.reshape(2, 5)}) != base
    assert digest({"w": t.clone()}) == base
    assert digest({"a": 0.1}) != digest({"a": 0.1 + 2**-55})


def test_rank_and_global_hash_depend_on_order_of_ranks_only() -> None:
    assert rank_hash({"a": "1", "b": "2"}) == rank_hash({"b": "2", "a": "1"})
    assert global_hash(["x", "y"]) != global_hash(["y", "x"])


def test_capture_draws_nothing_and_round_trips_without_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    seed_everything(5, rank=1, mode="fast")
    gen = torch.Generator().manual_seed(3)
    before = rng.capture({"g": gen})
    assert digest(rng.capture({"g": gen})) == digest(before)
    buf = io.BytesIO()
    torch.save(before, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    expected = (random.random(), np.random.rand(), torch.rand(1).item(), torch.rand(1, generator=gen).item())
    rng.restore(loaded, {"g": gen})
    assert (random.random(), np.random.rand(), torch.rand(1).item(), torch.rand(1, generator=gen).item()) == expected


def test_restore_refuses_rng_state_of_another_torch_version() -> None:
    state = rng.capture()
    state[rng.TORCH] = {"state": torch.zeros(16, dtype=torch.uint8)}
    with pytest.raises(UsageError, match="another torch version"):
        rng.restore(state)


def test_strict_mode_requires_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(UsageError, match="PYTHONHASHSEED"):
        seed_everything(1, mode="strict")


def test_ranks_get_distinct_seeds_from_one_run_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    seeds = {seed_everything(9, rank=r, mode="fast").rank_seed for r in range(4)}
    assert len(seeds) == 4
    assert seed_everything(9, rank=2, mode="fast").rank_seed == seed_everything(9, rank=2, mode="fast").rank_seed


def test_sampler_resumes_mid_epoch_with_the_exact_tail() -> None:
    full = ResumableDistributedSampler(103, rank=1, world_size=2, seed=4)
    full.set_position(3, 0)
    whole = list(full)
    cut = ResumableDistributedSampler(103, rank=1, world_size=2, seed=4)
    cut.load_state_dict({"seed": 4, "epoch": 3, "position": 20})
    assert list(cut) == whole[20:]
    assert len(whole) == 51


def test_sampler_shards_are_disjoint_and_epochs_reshuffle() -> None:
    shards = [ResumableDistributedSampler(100, r, 4, seed=1) for r in range(4)]
    seen = [i for s in shards for i in s]
    assert sorted(seen) == list(range(100))
    s = shards[0]
    first = list(s)
    s.set_position(1, 0)
    assert list(s) != first


def test_sample_randomness_is_a_function_of_seed_epoch_index() -> None:
    a = torch.rand(3, generator=sample_generator(1, 2, 3))
    assert torch.equal(a, torch.rand(3, generator=sample_generator(1, 2, 3)))
    assert not torch.equal(a, torch.rand(3, generator=sample_generator(1, 3, 3)))


def test_overrides_are_yaml_typed(tmp_path) -> None:
    cfg = load_config(None, ["train.steps=12", "chaos.signal_at_steps=[3, 5]", "train.amp=true", "train.lr=1e-3"])
    assert (cfg.train.steps, cfg.chaos.signal_at_steps, cfg.train.amp, cfg.train.lr) == (12, [3, 5], True, 0.001)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["train.stepz=3"], ["train.stepz", "Did you mean train.steps"]),
        (["train.steps=ten"], ["train.steps", "an integer"]),
        (["train.steps=0"], ["train.steps", "positive"]),
        (["train.amp=1"], ["train.amp", "true or false"]),
        (["determinism.mode=loose"], ["determinism.mode", "strict, fast"]),
        (["chaos.signal_at_steps=[1, x]"], ["chaos.signal_at_steps", "'x'"]),
        (["slurm.signal=USR9"], ["slurm.signal", "not a signal name"]),
        (["train.entrypoint=nocolon"], ["train.entrypoint", "package.module:function"]),
        (["train=3"], ["train", "mapping"]),
        (["slurm.time_min=-5"], ["slurm.time_min", "positive"]),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(overrides: list[str], words: list[str]) -> None:
    with pytest.raises(UsageError) as info:
        load_config(None, overrides)
    for word in words:
        assert word in str(info.value)


def test_signal_caught_before_the_session_counts_for_the_session() -> None:
    import os
    import signal

    from legato.dist.stop import StopFlag

    early = StopFlag((signal.SIGUSR2,))
    early.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert early.raised
        session_flag = StopFlag((signal.SIGUSR2,))
        session_flag.install()
        assert session_flag.raised and session_flag.received_at == early.received_at
        session_flag.uninstall()
    finally:
        early.uninstall()


def test_port_depends_on_job_and_restart() -> None:
    from legato.orchestrator.jobside import Identity

    def port(job: str, restart: int) -> int:
        return Identity("slurm", job, restart, 0, 2, 0, 2, ("n1",)).port

    assert port("100", 0) == port("100", 0)
    assert len({port("100", 0), port("100", 1), port("101", 0)}) == 3
    assert all(10000 <= port(str(j), r) < 30000 for j in range(50) for r in range(3))


def test_local_jobs_are_given_the_gpus_the_supervisor_sees(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """submitit's LocalExecutor hides every GPU it is not handed. This machine has no GPU, so a stand-in `nvidia-smi`
    lists two (the only fake here); CUDA_VISIBLE_DEVICES, when set, wins."""
    from legato.slurm.submission import visible_gpus

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-b)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus() == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert visible_gpus() == (3,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-61f49e3f,2")
    with caplog.at_level(logging.WARNING, logger="legato"):
        assert visible_gpus() == (2,)
    assert "names GPUs by UUID" in caplog.text


def test_placement_refuses_what_the_machine_cannot_honour() -> None:
    from legato.runtime.devices import resolve_placement

    cpu = resolve_placement(load_config(None, ["train.backend=gloo"]).train, 1, 2)
    assert (str(cpu.device), cpu.backend, cpu.amp_dtype) == ("cpu", "gloo", torch.bfloat16)
    if torch.cuda.is_available():
        pytest.skip("the refusals below are for a machine without CUDA")
    for sets, words in ((["train.device=cuda"], "no usable CUDA device"), (["train.backend=nccl"], "NCCL moves CUDA tensors only")):
        with pytest.raises(UsageError, match=words):
            resolve_placement(load_config(None, sets).train, 0, 1)


def test_the_agreed_interval_at_most_doubles_after_a_burst_of_fast_steps() -> None:
    """A replay or a warm cache runs steps fast; the interval proposed after them must not jump to thousands of steps
    that the slower steps after it would take minutes to reach with a stop signal waiting."""
    import time

    from legato.dist.stop import StopAgreement

    agreement = StopAgreement(None)
    agreement.interval = 4
    agreement._last_check = (0, time.monotonic() - 1e-3)  # 1000 steps in a millisecond
    assert agreement._propose(1000) == 8
    agreement._last_check = (1000, time.monotonic() - 100.0)  # then one step per 10 s: shrinks at once
    assert agreement._propose(1010) == 1


def test_a_checkpoint_from_before_a_setting_existed_resumes_under_its_default(tmp_path) -> None:
    """Checkpoints recorded their training settings before train.parallel/accumulate/fsdp2 existed; a run at those
    settings' defaults still continues from them, and one that moved away from a default is refused naming it."""
    import pytest

    from legato.config import SETTINGS_ADDED_LATER, load_config, training_settings
    from legato.errors import UsageError
    from legato.store.resumable import check_compatible

    now = training_settings(load_config(None, []))
    before = {**now, "train": {k: v for k, v in now["train"].items() if k not in SETTINGS_ADDED_LATER}}
    manifest = {"world_size": 2, "torch_version": "2.13.0", "training": before}
    check_compatible(manifest, tmp_path / "checkpoints" / "step_10", 2, now, "2.13.0")
    sharded = training_settings(load_config(None, ["train.parallel=fsdp2"]))
    with pytest.raises(UsageError, match="train.parallel"):
        check_compatible(manifest, tmp_path / "checkpoints" / "step_10", 2, sharded, "2.13.0")
