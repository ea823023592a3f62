"""Hostile run directories: links inside checkpoints/ that point outside, manifests naming paths outside their
directory, oversized manifests. Each is refused with one paragraph (exit 2) or skipped with a warning, and the
syscall trace (strace) shows that nothing outside the run directory was opened, created, renamed or removed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, run_trainer

from legato.errors import UsageError
from legato.state.hashing import rank_hash
from legato.store import checkpoint as ckpt
from legato.store import commit
from legato.store import manifest as manifests
from legato.store.resumable import newest_usable

STRACE = shutil.which("strace")
TRACED = (
    "trace=open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,rmdir,link,linkat,symlink,symlinkat,truncate"
)


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def trainer(run_dir: Path, trace: Path | None, *sets: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={run_dir}"]
    for item in (*FAST_GPT, *sets):
        cmd += ["--set", item]
    if trace is not None:
        cmd = [STRACE, "-f", "-qq", "-e", TRACED, "-o", str(trace), *cmd]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore"))


def touched(trace: Path, outside: Path) -> list[str]:
    """Traced syscalls that name a path under `outside` (by its real path or through the link inside the run)."""
    return [line for line in trace.read_text(errors="replace").splitlines() if str(outside) in line]


def assert_one_paragraph(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.skipif(STRACE is None, reason="needs strace for the syscall-level evidence")
def test_tmp_step_linked_outside_is_refused_and_nothing_outside_is_touched(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (run_dir / "checkpoints").mkdir(parents=True)
    link = run_dir / "checkpoints" / ".tmp_step_10"
    link.symlink_to(outside)
    before = tree_digest(outside)
    trace = tmp_path / "strace.log"
    proc = trainer(run_dir, trace, "train.steps=20", "checkpoint.every_steps=10")
    assert_one_paragraph(proc, str(link), "symlink", "Remove the link")
    assert tree_digest(outside) == before and sorted(p.name for p in outside.iterdir()) == ["precious.txt"]
    assert touched(trace, outside) == []
    assert link.is_symlink(), "the refusal changes nothing, not even the link"


@pytest.mark.skipif(STRACE is None, reason="needs strace for the syscall-level evidence")
def test_checkpoint_linked_outside_is_refused_before_training(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    assert run_trainer(TINY_GPT, run_dir, *FAST_GPT, "train.steps=4", "checkpoint.every_steps=2").returncode == 0
    step4 = run_dir / "checkpoints" / "step_4"
    shutil.move(step4, outside)
    step4.symlink_to(outside)
    before, run_before = tree_digest(outside), tree_digest(run_dir)
    trace = tmp_path / "strace.log"
    proc = trainer(run_dir, trace, "train.steps=6", "checkpoint.every_steps=2")
    assert_one_paragraph(proc, str(step4), "symlink")
    assert tree_digest(outside) == before and tree_digest(run_dir) == run_before
    assert touched(trace, outside) == []


def test_legato_run_refuses_a_linked_checkpoint_before_submitting(tmp_path: Path) -> None:
    from test_supervisor import legato

    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_3").symlink_to(outside)
    proc = legato("run", str(TINY_GPT), "--set", f"run.dir={run_dir}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "step_3 is a symlink" in proc.stderr
    assert not (run_dir / "ledger.jsonl").exists() and list(outside.iterdir()) == []


def _checkpoint(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    assert run_trainer(TINY_GPT, run_dir, *FAST_GPT, "train.steps=2", "checkpoint.every_steps=2").returncode == 0
    return run_dir / "checkpoints" / "step_2"


def _rewrite_manifest(path: Path, change) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    manifest["manifest_sha256"] = manifests.manifest_checksum(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_manifests_naming_paths_outside_or_oversized_are_not_read(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"outside")
    digest = {"sha256": hashlib.sha256(b"outside").hexdigest(), "bytes": 7}
    assert manifests.read_manifest(path)["step"] == 2

    _rewrite_manifest(path, lambda m: m["files"].update({"../../../secret.bin": digest}))
    with pytest.raises(ValueError, match="not a plain name inside the checkpoint"):
        manifests.read_manifest(path)
    _rewrite_manifest(path, lambda m: m["files"].pop("../../../secret.bin"))
    assert manifests.read_manifest(path)["step"] == 2

    (path / "rank0.pt").rename(tmp_path / "rank0.pt")
    (path / "rank0.pt").symlink_to(tmp_path / "rank0.pt")
    with pytest.raises(ValueError, match="rank0.pt is a symlink"):
        manifests.read_manifest(path)
    (path / "rank0.pt").unlink()
    (tmp_path / "rank0.pt").rename(path / "rank0.pt")

    with open(path / "manifest.json", "ab") as f:
        f.truncate(manifests.MAX_MANIFEST_BYTES + 1)
    with pytest.raises(ValueError, match="larger than 16 MiB"):
        manifests.read_manifest(path)
    assert newest_usable(path.parent) is None


def test_a_link_made_while_running_is_refused_by_the_writer_on_every_rank(tmp_path: Path) -> None:
    """write_checkpoint checks on every rank before its first barrier, so a link planted mid-run is refused the same way."""
    root, outside = tmp_path / "run" / "checkpoints", tmp_path / "outside"
    root.mkdir(parents=True)
    outside.mkdir()
    (root / ".tmp_step_7").symlink_to(outside)
    share = ckpt.RankShare(0, {"x.pt": {"a": 1}}, {}, "0" * 64)
    with pytest.raises(UsageError, match=r"\.tmp_step_7 is a symlink"):
        ckpt.write_checkpoint(root, 7, share, 1, None, {}, keep_last=3)
    assert list(outside.iterdir()) == [] and (root / ".tmp_step_7").is_symlink()


def test_what_a_killed_attempt_left_at_the_same_step_is_replaced_never_written_through(tmp_path: Path) -> None:
    """An asynchronous checkpoint's ranks write into the step's temporary directory as they find it (no barrier, no
    clearing first): a leftover file of the same name is replaced, even when it is a link (the target outside keeps
    its bytes), and whatever this attempt does not write is gone before the manifest, so the published checkpoint
    holds exactly what it lists. The commit phases are run as the asynchronous driver runs them, one rank."""
    root, outside = tmp_path / "run" / "checkpoints", tmp_path / "outside.pt"
    stale = root / ".tmp_step_7"
    (stale / "leftover_dir").mkdir(parents=True)
    outside.write_bytes(b"not legato's")
    (stale / "x.pt").symlink_to(outside)
    for name in ("shared3.pt", "manifest.json", ".report_rank1.json"):
        (stale / name).write_bytes(b"from a killed attempt")
    tmp = commit.stage(root, 7, 0, fresh=False)
    written = commit.write_files(tmp, {"x.pt": {"a": 1}})
    reports = [commit.report(0, rank_hash({}), {}, written, None)]
    commit.publish(root, tmp, 7, 1, reports, commit.combined_hash(reports), {}, None)
    assert outside.read_bytes() == b"not legato's"
    assert sorted(p.name for p in (root / "step_7").iterdir()) == ["manifest.json", "x.pt"]
    assert not (root / "step_7" / "x.pt").is_symlink()
    assert manifests.read_manifest(root / "step_7")["step"] == 7
