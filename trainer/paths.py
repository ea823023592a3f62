"""The run-directory contract: the one place that names every file and folder of a run.

    run_dir/
      config.yaml                  the captured, resolved config every job reads
      ledger.jsonl, .ledger.lock   the append-only event log and its lock
      progress.json                rank 0's latest step, loss and rate
      run_id                       the run's identity, created once and kept across requeues (trackers continue under it)
      attempt.lock                 held by the training launch's rank 0 (a POSIX lock), naming it: one launch at a time
      supervisor.lock, supervisor.json, supervisor.log   who supervises, and a detached one's log
      checkpoints/step_<N>/        published barrier checkpoints (manifest.json inside)
      checkpoints/.tmp_step_<N>/   a checkpoint being written, never selectable
      trajectory/rank<R>.jsonl     per-rank trajectory
      repro/<job>/<attempt>[/node<N>]/   environment captures
      repro/fingerprint.key        the key of the captures' value fingerprints
      hangs/<job>/<attempt>/       a hung attempt's stacks (one file per process), the ranks' summaries and its record
      .activity/<job>.<attempt>    touched by a rank busy outside its steps (a validation): the hang watchdog's shared mark
      pace/<job>/<attempt>/rank<R>.jsonl   each rank's data waits and forward times, a window at a time (stragglers)
      submitit/<job>/              the tasks' submitit folders and logs
      submitit/controllers.log     what a local job's controller itself printed (not the terminal's to see)

Readers and writers in every package take their paths from `RunPaths`; no
other module spells these names. It must stay free of I/O and heavy imports:
the command line loads it for every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_MANIFEST = "manifest.json"
STEP_PREFIX = "step_"
TMP_STEP_PREFIX = ".tmp_step_"
FINGERPRINT_KEY = "fingerprint.key"


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run directory, rooted at `root`: every file and folder of a run, named once."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def ledger_lock(self) -> Path:
        return self.root / ".ledger.lock"

    @property
    def progress(self) -> Path:
        return self.root / "progress.json"

    @property
    def run_id(self) -> Path:
        return self.root / "run_id"

    @property
    def attempt_lock(self) -> Path:
        return self.root / "attempt.lock"

    @property
    def supervisor_lock(self) -> Path:
        return self.root / "supervisor.lock"

    @property
    def supervisor_holder(self) -> Path:
        return self.root / "supervisor.json"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"{STEP_PREFIX}{step}"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectory"

    def trajectory(self, rank: int) -> Path:
        return self.trajectories / f"rank{rank}.jsonl"

    @property
    def repro(self) -> Path:
        return self.root / "repro"

    @property
    def fingerprint_key(self) -> Path:
        return self.repro / FINGERPRINT_KEY

    def capture(self, job_id: str, attempt: int, node: int = 0) -> Path:
        dest = self.repro / job_id / str(attempt)
        return dest / f"node{node}" if node else dest

    @property
    def hang_root(self) -> Path:
        return self.root / "hangs"

    def hangs(self, job_id: str, attempt: int) -> Path:
        return self.hang_root / job_id / str(attempt)

    def activity(self, job_id: str, attempt: int) -> Path:
        return self.root / ".activity" / f"{job_id}.{attempt}"

    @property
    def pace_root(self) -> Path:
        return self.root / "pace"

    def pace(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.pace_root / job_id / str(attempt) / f"rank{rank}.jsonl"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def controllers_log(self) -> Path:
        return self.submitit / "controllers.log"

    def task_log(self, job_id: str, rank: int, stream: str) -> Path:
        """submitit's log of one task: `stream` is "out" or "err"."""
        return self.submitit / job_id / f"{job_id}_{rank}_log.{stream}"

    @property
    def loss_plot(self) -> Path:
        return self.root / "loss.png"
