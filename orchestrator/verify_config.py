"""`legato verify CONFIG`: prove that a config resumes bit for bit by running it twice under the supervisor.

It sits beside verify_command.py (`legato verify --command`, the same proof for
any script): the two workflows differ only in how runs are launched, so they
live together and both hand a `Verdict` back; verify.py holds what they share
(planning, comparison, the record of a verdict). Here the reference and the
interrupted configs come from `plan_runs` and each is carried to its end by a
`Supervisor`, exactly as `legato run` would; when the runs part before any
resume, the reference runs once more to tell non-determinism from a bad resume.

This module must never format for people or choose an exit code: phases and
supervisor events go to the callbacks it is given, the verdict to its caller.
"""

from __future__ import annotations

from pathlib import Path

from legato.config import Config
from legato.errors import EXIT_USAGE
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.rundir import SupervisorLock, capture_config
from legato.orchestrator.supervisor import Notify, Supervisor, start_session
from legato.orchestrator.verify import Phase, Verdict, compare_runs, nondeterminism, plan_runs, reused_reference, stale_reference


def verify_config(cfg: Config, steps: list[int], out: Path, phase: Phase, notify: Notify, reuse: Path | None = None) -> Verdict | None:
    """The verdict for `cfg` stopped after `steps`, or None when the reference run refused its config (a usage error).

    `reuse`: the finished reference of an earlier verification of the same config, compared against instead of
    training the reference again (refused with a UsageError, before anything runs, when it was trained otherwise). No
    reference is trained then: runs that part before any resume are told apart by verifying without it (the cause says so).
    `phase` hears "planned" (with world_size, steps, signal_rank, at), "reference" (or "reused", with its dir),
    "interrupted" and "again"; `notify` hears every supervisor event of every run.
    """
    reference_cfg, run_cfg = plan_runs(cfg, out, steps)
    reference = reused_reference(reuse, reference_cfg) if reuse is not None else reference_cfg.run_dir
    phase("planned", {"world_size": cfg.world_size, "steps": cfg.train.steps, "signal_rank": run_cfg.chaos.signal_rank, "at": steps})
    if reuse is not None:
        phase("reused", {"dir": str(reference)})
    else:
        phase("reference", {})
        if run_to_end(reference_cfg, notify) == EXIT_USAGE:
            return None
    phase("interrupted", {})
    run_to_end(run_cfg, notify)
    verdict = compare_runs(reference, run_cfg.run_dir)
    if reuse is not None:
        verdict.reference = str(reference)
        if verdict.diverged_before_resuming and verdict.divergence is not None:
            verdict.cause = stale_reference(reference, verdict.divergence)
        return verdict
    if verdict.diverged_before_resuming:
        phase("again", {})
        again = plan_runs(cfg, out / "again", steps)[0]
        run_to_end(again, notify)
        verdict.cause = nondeterminism(reference, again.run_dir, verdict.world_size) or verdict.cause
    return verdict


def run_to_end(cfg: Config, notify: Notify) -> int:
    """Carry one planned run to its end under the supervisor lock; the session's exit code."""
    lock = SupervisorLock(cfg.run_dir)
    lock.acquire()
    try:
        config_path = capture_config(cfg)
        start_session(cfg, Ledger(cfg.run_dir), ["legato", "verify"])
        return Supervisor(cfg, config_path, notify).run()
    finally:
        lock.release()
