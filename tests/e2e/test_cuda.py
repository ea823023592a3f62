"""The CUDA path on a real GPU: bitwise resumes under `legato verify`, planted faults named, fast mode told apart.

Every test here needs a CUDA device and is skipped with the reason on machines without one (CI has none);
`scripts/gpu_check.sh` runs them on a GPU machine, and docs/gpu.md records what they printed there. They drive
the real `legato verify` (real processes, real stop signals, NCCL or gloo over CUDA tensors) on the bundled
tiny GPT and MLP in strict mode, and compare bits only; and the digest of a CUDA tensor, computed on the GPU, is the one the CPU
computes by the same rule from the same bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import FAST_GPT, MLP, ROOT, TINY_GPT

from legato.session.policy import CheckpointPolicy
from legato.session.replay import HeldFingerprint, fingerprint, take_fingerprint
from legato.session.replay_base import ReplayBase
from legato.state import recipes
from legato.state.device_digest import CHUNK_ROWS, ROW_WORDS, device_digest
from legato.state.hashing import Digests, digest
from legato.state.snapshot import LANES_ON_DEVICE_BYTES, Snapshot, batch_tensors

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)"),
]

# One rank with an NCCL process group (so DDP and NCCL run, on the one GPU), or two ranks on the one GPU with gloo
# moving the CUDA tensors (NCCL refuses two ranks on one GPU).
NCCL_1 = ("local.tasks=1", "train.backend=nccl")
GLOO_2 = ("local.tasks=2", "train.backend=gloo")
MLP_FAST = (
    "train.steps=30",
    "checkpoint.every_steps=0",
    "checkpoint.hash_every_steps=3",
    "checkpoint.agree_every_steps=1",
    "checkpoint.replay_steps=4",
    "checkpoint.replay_cost=0",
    "chaos.signal_at_steps=[]",
)


def verify(tmp_path: Path, config: Path, *sets: str, interrupt_at: str = "7,19") -> tuple[int, dict, str]:
    base = FAST_GPT if config == TINY_GPT else MLP_FAST
    cmd = [
        sys.executable,
        "-m",
        "legato.orchestrator.cli",
        "verify",
        str(config),
        "--out",
        str(tmp_path / "verify"),
        "--json",
        "--interrupt-at",
        interrupt_at,
        "--set",
        "train.device=cuda",
    ]
    for item in (*base, *sets):
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    out = proc.stdout + proc.stderr
    start = proc.stdout.find("\n{") + 1 if "\n{" in proc.stdout else proc.stdout.find("{")
    assert start >= 0, out[-3000:]
    return proc.returncode, json.loads(proc.stdout[start:]), out


CASES = {
    "gpt-nccl-1": (TINY_GPT, NCCL_1),
    "gpt-gloo-2": (TINY_GPT, GLOO_2),
    "mlp-nccl-1": (MLP, NCCL_1),
    "mlp-gloo-2": (MLP, GLOO_2),
    "gpt-bf16-autocast": (TINY_GPT, (*GLOO_2, "train.amp=true", "train.amp_dtype=bfloat16")),
    "gpt-fp16-gradscaler": (TINY_GPT, (*NCCL_1, "train.amp=true", "train.amp_dtype=float16")),
    "gpt-loader-workers": (TINY_GPT, (*GLOO_2, "train.num_workers=2")),
    # checkpoint.async unset: on for a model on a GPU, so the periodic checkpoints are written in the background.
    "gpt-async-by-default": (TINY_GPT, (*GLOO_2, "checkpoint.every_steps=5")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_strict_cuda_run_resumes_bitwise_across_two_signals(tmp_path: Path, case: str) -> None:
    config, sets = CASES[case]
    code, verdict, out = verify(tmp_path, config, *sets)
    assert code == 0, out[-4000:]
    assert verdict["identical"] and [r["step"] for r in verdict["resumes"]] == [8, 20], verdict
    assert all(r["match"] for r in verdict["resumes"]) and verdict["reference_final_hash"] == verdict["run_final_hash"]
    log = "\n".join(p.read_text() for p in (tmp_path / "verify").rglob("*.err"))
    assert "trains on cuda:0" in log, "the ranks did not report training on the GPU"
    if case == "gpt-async-by-default":
        assert "asynchronous checkpoint step 5 committed" in log, "the periodic checkpoints were not written in the background"
    kind = "{} (sm_{}{})".format(torch.cuda.get_device_name(0), *torch.cuda.get_device_capability(0))
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "verify").rglob("step_*/manifest.json")]
    assert manifests and all(m["gpus"] == [kind] * m["world_size"] for m in manifests), "each rank's GPU is recorded"


FAULTS = {
    "cuda-rng": (("chaos.skip_restore=[cuda]",), ("rng.cuda", "CUDA generator")),
    "scaler": (("train.amp=true", "train.amp_dtype=float16", "chaos.skip_restore=[scaler]"), ("the scaler state is missing",)),
    "model": (("chaos.skip_restore=[model]",), ("the model weights were not restored",)),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_planted_fault_on_cuda_is_named(tmp_path: Path, fault: str) -> None:
    sets, needles = FAULTS[fault]
    code, verdict, out = verify(tmp_path, TINY_GPT, *GLOO_2, *sets, interrupt_at="12")
    assert code == 1, out[-4000:]
    assert not verdict["identical"]
    for needle in needles:
        assert needle in verdict["cause"], verdict["cause"]


def test_fast_mode_non_determinism_is_told_apart_from_a_resume_fault(tmp_path: Path, record_property) -> None:
    """Fast mode lets CUDA pick non-deterministic kernels (the embedding's backward adds with atomics): verify either
    proves the resume (the kernels happened to agree) or blames the computation, never the resume. Which one it met is
    kept as the test's `outcome` property (gpu_check.sh writes the properties to tests.xml)."""
    code, verdict, out = verify(tmp_path, TINY_GPT, *NCCL_1, "determinism.mode=fast")
    record_property("outcome", "identical" if code == 0 else verdict.get("cause"))
    if code == 0:
        assert verdict["identical"], verdict
        return
    assert code == 1, out[-4000:]
    cause = verdict["cause"]
    assert "non-deterministic" in cause or "before any resume" in cause, cause
    assert "did not restore" not in cause, cause


def test_environment_capture_on_a_gpu_machine_names_the_gpu_and_redacts_secrets(tmp_path: Path) -> None:
    secrets = {
        "WANDB_API_KEY": "wandb-secret-0123456789abcdef",
        "HF_TOKEN": "hf_secretTOKENvalue0123456789",
        "MY_PASSWORD": "hunter2-long-secret",
    }
    out = tmp_path / "capture"
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", "repro", "capture", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **secrets),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = "\n".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    assert "Driver Version" in text and torch.version.cuda in text and torch.cuda.get_device_name(0) in text
    assert '"nccl": "' in text and '"cudnn": ' in text
    for value in secrets.values():
        assert value not in text


# Sizes around the device rule's rows and chunks (legato.state.device_digest).
ROWS = ROW_WORDS * 8  # bytes in a row of words
CHUNK = ROWS * CHUNK_ROWS  # bytes mixed at once
DIGESTED = {
    "one byte": lambda: torch.tensor([7], dtype=torch.uint8),
    "odd bf16": lambda: torch.randn(1001).to(torch.bfloat16),
    "one row": lambda: torch.randn(ROWS // 4),
    "a chunk and a byte": lambda: torch.randint(0, 256, (CHUNK + 1,), dtype=torch.uint8),
    "three chunks and seven bytes": lambda: torch.randint(0, 256, (3 * CHUNK + 7,), dtype=torch.uint8),
    "transposed": lambda: torch.randn(1500, 2100).t(),
}


@pytest.mark.parametrize("name", sorted(DIGESTED))
def test_digest_of_a_cuda_tensor_is_the_device_rule_the_cpu_computes(name: str) -> None:
    """A CUDA tensor is digested on the GPU by the device rule: the same digest the CPU computes from the same bytes, so
    a state hashed on one device is proven on another."""
    host = DIGESTED[name]()
    device = host.cuda()
    assert Digests().tensor(device) == device_digest(host.contiguous())


def test_cuda_digest_follows_the_work_queued_before_it_and_sees_every_chunk() -> None:
    """The digest's kernels follow the kernel that wrote the tensor (no synchronize in between), and a byte changed in the
    first or the last chunk changes the digest (planted faults)."""
    host = torch.randint(0, 256, (2 * CHUNK + 3,), dtype=torch.uint8)
    device = host.cuda()
    torch.cuda.synchronize()
    device.add_(1)  # queued, and digested at once
    assert Digests().tensor(device) == device_digest(host + 1)
    for where in (0, host.numel() - 1):
        changed = device.clone()
        changed[where] += 1
        assert Digests().tensor(changed) != Digests().tensor(device), f"a change at byte {where} went unseen"


def test_a_snapshot_taken_on_a_side_stream_reports_the_live_digests_to_another_thread() -> None:
    """A snapshot's lanes land on the host behind an event on the loop's stream: read from another thread (as the
    asynchronous writer reads them) while the loop runs on a side stream, which the default stream does not wait for,
    they are the live tensors' digests, for a tensor whose lanes are taken on the GPU and one digested from its copy;
    and the live tensor changed right after the take (queued behind the lanes) does not reach them."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        model = {"big": torch.randn(LANES_ON_DEVICE_BYTES // 2, device="cuda"), "small": torch.randn(7, device="cuda")}
        parts = {"model": model}
        expected = {"model": digest(model)}
        snap = Snapshot()
        snap.take(1, parts, {"rank0.pt": model}, set())
        model["big"].add_(1)
        with ThreadPoolExecutor(1) as pool:
            share = pool.submit(snap.share).result()
    assert [c.components for c in recipes.complete([share])] == [expected]


def test_a_step_record_of_a_cuda_batch_and_gradients_waits_for_nothing_and_holds_them_as_they_were() -> None:
    """A replay base's step record on CUDA, as a step takes it (`ReplayBase.yielded` with the batch the Session yields,
    `record_step` with the gradients on the first step past the base), synchronizes nothing (any wait raises under the
    sync debug mode) and saves, later, the fingerprints of the tensors as they were then: the values `fingerprint` gives
    for them, not the ones after the loop's writes into them (queued behind the copies). The batch holds a sampled
    tensor, a transposed one, a bool mask and an empty one."""
    base = ReplayBase(CheckpointPolicy(replay_steps=4), rank=0)
    assert base.snapshot is not None
    base.snapshot.step = 0
    model = torch.nn.Linear(1024, 4, device="cuda")
    batch = {
        "x": torch.randn(512, 1024, device="cuda"),
        "t": torch.randn(64, 32, device="cuda").t(),
        "mask": torch.rand(512, device="cuda") > 0.5,
        "empty": torch.empty(0, 3, device="cuda"),
    }
    model(batch["x"]).sum().backward()
    tensors, grads = batch_tensors(batch), [p.grad for p in model.parameters()]
    batch_reference, grads_reference = fingerprint(tensors), fingerprint(grads)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        base.yielded(batch)
        base.record_step(1, 0.5, model)
        batch["x"].mul_(2)  # the next step's body normalizes its batch in place
        model(batch["x"]).sum().backward()  # and accumulates into the gradients
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert fingerprint(tensors) != batch_reference and fingerprint(grads) != grads_reference, "the writes change the tensors"
    record = base.share(None)["steps"][0]
    assert (record["batch"], record["grads"]) == (batch_reference, grads_reference)


def test_a_cuda_batch_and_gradients_are_fingerprinted_without_waiting_for_the_device_and_as_they_were() -> None:
    """A step record's fingerprint of a CUDA batch (or gradients) synchronizes nothing when it is taken (any wait raises
    under the sync debug mode) and reads back, later, the tensors as they were: the value `fingerprint` gives for them,
    not the one after the loop's writes into them (queued behind the copy)."""
    batch = [torch.randn(64, 3, 32, 32, device="cuda"), torch.randint(0, 10, (64,), device="cuda")]
    grads = [None, torch.randn(4096, 1024, device="cuda")]  # a frozen parameter's and a trained one's
    reference, grads_reference = fingerprint(batch), fingerprint(grads)
    torch.cuda.set_sync_debug_mode("error")
    try:
        held, held_grads = take_fingerprint(batch), take_fingerprint(grads)
        batch[0].mul_(2)  # the body normalizes its batch in place
        grads[1].add_(1)  # the next step's backward accumulates into the gradients
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert isinstance(held, HeldFingerprint) and isinstance(held_grads, HeldFingerprint)
    assert fingerprint(batch) != reference and fingerprint(grads) != grads_reference, "the writes change the tensors"
    assert held() == reference and held_grads() == grads_reference
