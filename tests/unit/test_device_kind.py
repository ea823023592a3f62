"""The device a rank computes on, in one process: a checkpoint records each rank's GPU (model and compute capability,
None for the CPU), and a resume on another kind is refused in strict mode and warned of in fast, rank by rank, with
the fix. There is no GPU here: the GPU names below are what legato.state.device_kind writes on one, and
e2e/test_cuda.py checks what a real GPU run records (scripts/gpu_check.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import legato
from legato.session.resume import _rules_changed
from legato.state.device_kind import gpu_kind
from legato.state.hashing import tensor_rules
from legato.store.manifest_schema import TENSOR_DIGESTS_KEY, check_manifest
from legato.store.resumable import check_compatible

PATH = Path("/r/checkpoints/step_5")
A100, H100 = "NVIDIA A100-SXM4-80GB (sm_80)", "NVIDIA H100 80GB HBM3 (sm_90)"


def saved(*gpus: str | None) -> dict:
    """A manifest's fields the check reads, with each rank's GPU as it wrote."""
    return {
        "world_size": len(gpus),
        "torch_version": "2.13.0",
        "threads": 1,
        "training": None,
        "ranks": [{"rank": r} for r in range(len(gpus))],
        "gpus": list(gpus),
    }


def check(manifest: dict, live: tuple[str | None, ...] | None, strict: bool = True, training: dict | None = None) -> None:
    check_compatible(manifest, PATH, manifest["world_size"], training, "2.13.0", threads=1, strict=strict, gpus=live)


def test_a_model_on_the_cpu_has_no_gpu_and_cuda_is_left_alone() -> None:
    before = torch.cuda.is_initialized()  # an earlier test in this process may have started it on a GPU machine
    assert gpu_kind(torch.nn.Linear(2, 1)) is None
    assert torch.cuda.is_initialized() == before


def test_another_gpu_model_on_any_rank_is_refused_in_strict_naming_the_ranks_both_models_and_the_fix() -> None:
    with pytest.raises(legato.UsageError) as info:
        check(saved(A100, A100, A100), (A100, H100, H100))
    text = str(info.value)
    assert f"ranks 1, 2: {A100} when written, {H100} now" in text and "rank 0" not in text
    assert "#SBATCH --constraint=<feature> or --gres=gpu:<type>:<count>" in text and 'mode="fast"' in text


def test_a_gpu_run_resumed_on_the_cpu_or_the_other_way_round_is_named_and_a_config_gets_its_own_fix() -> None:
    with pytest.raises(legato.UsageError) as info:
        check(saved(A100, A100), (None, None))
    assert f"ranks 0, 1: {A100} when written, the CPU now" in str(info.value)
    assert "moved between a GPU and the CPU follow another rule" in str(info.value)  # its digests cannot prove the restore
    training = {"determinism": {"mode": "strict"}}
    with pytest.raises(legato.UsageError, match="rank 0: the CPU when written") as info:
        check({**saved(None), "training": training}, (H100,), training=training)
    assert "slurm.extra_sbatch: {constraint: <feature>} or {gres: gpu:<type>:<count>}" in str(info.value)


def test_fast_mode_warns_and_the_same_kind_an_older_manifest_or_an_unknown_run_passes(caplog: pytest.LogCaptureFixture) -> None:
    check(saved(A100), (H100,), strict=False)
    assert f"rank 0: {A100} when written, {H100} now" in caplog.text and "Continuing because the determinism mode" in caplog.text
    assert "another rule" not in caplog.text  # both GPUs digest by the device rule
    check(saved(A100, None), (A100, None))  # a mixed allocation resumes on the same mix
    check({k: v for k, v in saved(A100).items() if k != "gpus"}, (H100,))
    check(saved(A100), None)  # the launcher's check, before any rank runs: not known there


def test_a_manifest_whose_gpu_is_not_a_name_is_refused() -> None:
    manifest = {
        "step": 1,
        "world_size": 1,
        "torch_version": "2.13.0",
        "global_hash": "",
        "files": {},
        "gpus": [3],
        "ranks": [{"rank": 0, "hash": "", "components": {}}],
    }
    with pytest.raises(ValueError, match=r"gpus\[0\] is an int"):
        check_manifest(manifest)


def test_a_session_on_the_cpu_records_no_gpu_for_its_rank(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = legato.Session(tmp_path, model=model, optimizer=optimizer, total_steps=2, census="off")
    for _ in session:
        loss = model(torch.ones(1, 2)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.report(loss)
    manifest = json.loads((tmp_path / "checkpoints" / "step_2" / "manifest.json").read_text())
    assert manifest["gpus"] == [None] and manifest["model_compiled"] is False
    assert manifest["tensor_digests"] == {"cuda": "legato-words64-v1", "elsewhere": "xxh3_128"}


def test_a_failed_resume_names_a_checkpoint_whose_gpu_digests_follow_another_rule() -> None:
    """A GPU checkpoint of an older legato (its GPU tensors digested with XXH3 on the host) fails its check here: the
    failure says why; a CPU checkpoint, or one that records this legato's rules, says nothing of it."""
    older = {**saved(A100), "step": 5}
    assert "digested its GPU tensors by the rule 'xxh3_128'" in _rules_changed(older, PATH)
    assert _rules_changed({**older, TENSOR_DIGESTS_KEY: tensor_rules()}, PATH) == ""
    assert _rules_changed({**saved(None), "step": 5}, PATH) == ""
