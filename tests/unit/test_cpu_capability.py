"""The instruction set of torch's CPU kernels, in one process: a resume by ranks whose kernels use another set than
when they wrote the checkpoint is refused in strict mode and warned of in fast, rank by rank. Real processes, the set
recorded in every checkpoint and pinned with ATEN_CPU_CAPABILITY: e2e/test_cpu_kind_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from legato.errors import UsageError
from legato.store.resumable import check_compatible

PATH = Path("/r/checkpoints/step_5")
TRAINING = {"determinism": {"mode": "strict"}}


def saved(*capabilities: str | None) -> dict:
    """A manifest's fields the check reads: each rank's capability as it wrote (None: an older legato's entry)."""
    ranks = [{"rank": r} if c is None else {"rank": r, "cpu_capability": c} for r, c in enumerate(capabilities)]
    return {"world_size": len(ranks), "torch_version": "2.13.0", "threads": 1, "training": TRAINING, "ranks": ranks}


def check(manifest: dict, live: tuple[str, ...] | None, strict: bool = True, training: dict | None = TRAINING) -> None:
    check_compatible(manifest, PATH, manifest["world_size"], training, "2.13.0", threads=1, strict=strict, cpu_capabilities=live)


def test_another_capability_on_any_rank_is_refused_in_strict_naming_the_ranks_the_sets_and_the_fix() -> None:
    with pytest.raises(UsageError) as info:
        check(saved("AVX512", "AVX512", "AVX512"), ("AVX512", "AVX2", "AVX2"))
    text = str(info.value)
    assert "ranks 1, 2: AVX512 when written, AVX2 now" in text and "rank 0" not in text
    assert "ATEN_CPU_CAPABILITY=avx512" in text and "slurm.extra_sbatch: {constraint:" in text and "determinism.mode: fast" in text


def test_a_mixed_allocation_resumes_on_the_same_mix_and_is_refused_on_another() -> None:
    mixed = saved("AVX512", "AVX2")
    check(mixed, ("AVX512", "AVX2"))
    with pytest.raises(UsageError, match="rank 0: AVX512 when written, AVX2 now; rank 1: AVX2 when written, AVX512 now") as info:
        check(mixed, ("AVX2", "AVX512"))
    assert "set to the set each wrote with" in str(info.value)


def test_fast_mode_warns_and_an_older_manifest_or_an_unknown_run_passes(caplog: pytest.LogCaptureFixture) -> None:
    check(saved("AVX512", "AVX512"), ("AVX2", "AVX2"), strict=False)
    assert "ranks 0, 1: AVX512 when written, AVX2 now" in caplog.text and "Continuing because determinism.mode is fast" in caplog.text
    check(saved(None, None), ("AVX2", "AVX2"))
    check(saved("AVX512", "AVX512"), None)  # the launcher's check, before any rank runs: not known there


def test_a_script_without_a_config_is_told_the_api_fix() -> None:
    with pytest.raises(UsageError) as info:
        check({**saved("AVX512"), "training": None}, ("AVX2",), training=None)
    text = str(info.value)
    assert 'seed_everything(seed, rank, mode="fast")' in text and "#SBATCH --constraint" in text
    assert "determinism.mode" not in text and "slurm." not in text


def test_the_pin_reaches_the_ranks_from_every_launcher_only_as_the_user_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from legato.config import load_config
    from legato.repro.redact import Redactor
    from legato.slurm.submission import slurm_parameters
    from legato.system.launch_env import determinism_environ

    assert "ATEN_CPU_CAPABILITY" not in determinism_environ({})
    assert determinism_environ({"ATEN_CPU_CAPABILITY": "avx2"})["ATEN_CPU_CAPABILITY"] == "avx2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    # Into the job script as well: a cluster whose sbatch exports no environment still hands the pin to the ranks.
    assert "export ATEN_CPU_CAPABILITY=avx2" in slurm_parameters(load_config(None, ["executor=slurm"]), ())["setup"]
    assert Redactor().environ({"ATEN_CPU_CAPABILITY": "avx2"}) == {"ATEN_CPU_CAPABILITY": "avx2"}, "captured by value"
