"""The instruction set of torch's CPU kernels, in one process: a resume by ranks whose kernels use another set than the
checkpoint's writer is refused in strict mode and warned of in fast. Real processes, the set recorded in every
checkpoint and pinned with ATEN_CPU_CAPABILITY: e2e/test_cpu_kind_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from legato.errors import UsageError
from legato.store.manifest import check_compatible

PATH = Path("/r/checkpoints/step_5")
TRAINING = {"determinism": {"mode": "strict"}}
SAVED = {"world_size": 2, "torch_version": "2.13.0", "threads": 1, "training": TRAINING, "cpu_capability": "AVX512"}


def test_another_capability_on_any_rank_is_refused_in_strict_naming_the_ranks_the_sets_and_the_fix() -> None:
    with pytest.raises(UsageError) as info:
        check_compatible(SAVED, PATH, 2, TRAINING, "2.13.0", threads=1, strict=True, cpu_capabilities=("AVX512", "AVX2"))
    text = str(info.value)
    assert "kernels used AVX512, but rank 1 of this run use AVX2" in text
    assert "ATEN_CPU_CAPABILITY=avx512" in text and "--constraint" in text and "determinism.mode: fast" in text


def test_fast_mode_warns_and_the_same_set_or_an_older_manifest_passes(caplog: pytest.LogCaptureFixture) -> None:
    check_compatible(SAVED, PATH, 2, TRAINING, "2.13.0", threads=1, strict=False, cpu_capabilities=("AVX2", "AVX2"))
    assert "rank 0, 1 of this run use AVX2" in caplog.text and "Continuing because determinism.mode is fast" in caplog.text
    check_compatible(SAVED, PATH, 2, TRAINING, "2.13.0", threads=1, strict=True, cpu_capabilities=("AVX512", "AVX512"))
    older = {k: v for k, v in SAVED.items() if k != "cpu_capability"}
    check_compatible(older, PATH, 2, TRAINING, "2.13.0", threads=1, strict=True, cpu_capabilities=("AVX2", "AVX2"))
    check_compatible(SAVED, PATH, 2, TRAINING, "2.13.0", threads=1, strict=True)  # the launcher's check: ranks unknown


def test_a_script_without_a_config_is_told_the_api_fix() -> None:
    with pytest.raises(UsageError) as info:
        check_compatible({**SAVED, "training": None}, PATH, 2, None, "2.13.0", strict=True, cpu_capabilities=("AVX2",))
    assert 'seed_everything(seed, rank, mode="fast")' in str(info.value) and "determinism.mode" not in str(info.value)

