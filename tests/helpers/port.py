"""Helpers to run the ported example scripts (examples/port) as 2 real ranks and compare two of their runs
exactly; shared by e2e/test_port.py, e2e/test_torchrun.py and cluster/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from conftest import ROOT, manifest, model_state, run_ranks, trajectory
from helpers.shared_runs import SharedRuns, run_key

from legato.runtime.launch import free_port

PORT = ROOT / "examples" / "port"
# Global RNGs that nanoGPT and the DDP tutorial never seed (the ImageNet example seeds all three): see assert_same_run.
UNSEEDED = ("rng.python", "rng.numpy")


def torchrun_reference(shared_runs: SharedRuns) -> Path:
    """The nanoGPT port run to its end by `python -m legato.torchrun` (2 ranks), no stop: trained once per suite for
    every test that compares a stopped launch with it (read it only)."""

    def build(run_dir: Path) -> None:
        command = [sys.executable, "-m", "legato.torchrun", "--max-restarts", "0", "--nproc-per-node", "2"]
        command += ["--master-port", str(free_port()), str(PORT / "nanogpt_legato.py"), str(run_dir)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
        assert done.returncode == 0, done.stderr[-3000:]

    return shared_runs.get(run_key("nanogpt_port_torchrun_reference"), build)


def launch(script: Path, out: Path, *args: str, **env: str) -> list[subprocess.CompletedProcess]:
    out.mkdir(parents=True, exist_ok=True)
    return run_ranks([sys.executable, str(script), str(out), *args], PYTHONPATH=str(ROOT), **env)


# What a C++ thread ended from under it by Python's finalization prints before the process aborts (docs/hardening.md).
FINALIZATION_ABORT = "terminate called without an active exception"


def plain_finished(runs: list[subprocess.CompletedProcess], out: Path) -> str | None:
    """None when every rank of a plain (legato-free) run finished, else what went wrong, with the ranks' stderr.

    A rank finished when it exited 0, or when it wrote its result and then died of gloo's finalization abort: a gloo
    worker that still holds the script's last collective when Python finalizes ends the process with SIGABRT after
    the script's last line. legato's ranks have an exit hook against it (docs/hardening.md, "Clean exits"); the plain
    originals do not, so that abort is torch's, and the result on disk is the run's. Anything else fails."""

    def finished(rank: int, run: subprocess.CompletedProcess) -> bool:
        aborted = run.returncode == -signal.SIGABRT and FINALIZATION_ABORT in run.stderr
        return run.returncode == 0 or (aborted and (out / f"result_rank{rank}.json").exists())

    if all(finished(rank, run) for rank, run in enumerate(runs)):
        return None
    return "\n".join(f"--- rank {rank}, exit {run.returncode}:\n{run.stderr[-2000:]}" for rank, run in enumerate(runs))


def result(out: Path, rank: int) -> dict:
    return json.loads((out / f"result_rank{rank}.json").read_text())


def assert_same_run(reference: Path, resumed: Path, steps: int, unseeded: tuple[str, ...] = ()) -> None:
    """Same model tensors, same loss_hex at every step and the same digest of every component on every rank.

    `unseeded` names the global RNGs a script never seeds (nanoGPT and the DDP tutorial leave python's and
    numpy's alone, as the originals do): they start from os.urandom in every process, two plain runs included,
    so no run can match another there, and legato must not seed them for the user (`legato verify --command`
    names them instead). The scripts never draw from them either, so the resumed run is checked against itself:
    each attempt restored them, so every checkpoint holds the state the first attempt started with (an attempt
    that kept its own fresh state would show it at its first checkpoint).
    """
    ref_model, res_model = model_state(reference, steps), model_state(resumed, steps)
    assert all(torch.equal(ref_model[k], res_model[k]) for k in ref_model) and ref_model.keys() == res_model.keys()
    for rank in range(2):
        ref, res = manifest(reference, steps)["ranks"][rank]["components"], manifest(resumed, steps)["ranks"][rank]["components"]
        assert {k: v for k, v in res.items() if k not in unseeded} == {k: v for k, v in ref.items() if k not in unseeded}
        for name in unseeded:
            kept = {manifest(resumed, int(d.name[5:]))["ranks"][rank]["components"][name] for d in (resumed / "checkpoints").glob("step_*")}
            assert kept == {res[name]}, f"{name} on rank {rank} changed between the attempts' checkpoints"
        ref_traj, res_traj = trajectory(reference, rank), trajectory(resumed, rank)
        assert [r["step"] for r in res_traj] == list(range(1, steps + 1))
        assert [(r["loss_hex"], r["lr"], r["epoch"]) for r in res_traj] == [(r["loss_hex"], r["lr"], r["epoch"]) for r in ref_traj]
