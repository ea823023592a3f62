"""Everything checked before a run starts: the one entry point `legato run` and `legato verify` go through.

A config (a file and its `--set` values) is loaded and checked key by key
(`legato.config`), redacted as legato will write it, its entrypoint imported,
compared with what its run directory already holds (a captured config from
an earlier `legato run`, checkpoints from any run, the run of a script's own
Session: `check_compatible`), and its executor asked
whether it can run here (SLURM's `sbatch` and `srun` on PATH). Every refusal
is a `UsageError` in one paragraph, raised before the run directory exists, so
a refused config leaves nothing behind and harms nothing already saved. The
fuzz tests call this function in-process, exactly as the CLI does. This module
must NEVER create, write or submit anything: it only reads and imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from legato.config import Config, load_config, training_identity, training_settings
from legato.errors import UsageError
from legato.orchestrator.rundir import is_script_run, redact_config
from legato.paths import RunPaths
from legato.runtime.entrypoint import check_entrypoint
from legato.session.attempt_lock import held_by, refusal
from legato.slurm.backends import backend_for
from legato.store import manifest, resumable
from legato.system.threads import resolve_threads
from legato.treediff import changed_leaves


@dataclass
class Checked:
    """A config that passed every check, and the keys whose values were redacted (each worth a warning)."""

    cfg: Config
    hidden: list[str] = field(default_factory=list)


def checked_config(
    path: str | Path | None, overrides: Sequence[str] = (), executor: str | None = None, run_dir_matters: bool = True
) -> Checked:
    """The config `path` with `overrides` (and `executor`, as if set with --set), checked as a run would need it.

    `run_dir_matters`: whether the config's own run directory is used (`legato run`), so what it holds must fit
    (`legato verify` runs in a fresh directory of its own).
    """
    sets = [*overrides, f"executor={executor}"] if executor else list(overrides)
    cfg, hidden = redact_config(load_config(path, sets))
    check_entrypoint(cfg)
    if run_dir_matters:
        check_compatible(cfg)
    backend_for(cfg.executor).validate(cfg)
    return Checked(cfg, hidden)


def check_compatible(cfg: Config) -> None:
    """Refuse a config that cannot continue what the run directory holds."""
    run_dir = cfg.run_dir
    if is_script_run(run_dir):
        who = held_by(run_dir)
        if who is not None:
            raise UsageError(refusal(run_dir, who))
        raise UsageError(
            f"Run directory {run_dir} holds a run of a script's own legato.Session (its ledger records the script's attempts, "
            "and no `legato run` captured a config there), so this config would continue another loop's checkpoints. Launch "
            f"that script again to resume it (`legato watch {run_dir}` follows it), or give this config its own run.dir."
        )
    _check_checkpoints(cfg)
    captured = RunPaths(run_dir).config
    if not captured.is_file():
        return
    before = load_config(captured)
    differing = changed_leaves(training_identity(before), training_identity(cfg))
    if cfg.checkpoint.reshard and resumable.global_batch_kept(
        training_settings(before), training_settings(cfg), before.world_size, cfg.world_size
    ):
        # Opted into resharding: another world size with the per-rank batch changed to keep the global batch is this training.
        differing = [leaf for leaf in differing if leaf[0] not in ("world_size", resumable.BATCH_KEY)]
    if differing:
        shown = "; ".join(f"{key} was {old!r}, now {new!r}" for key, old, new in differing[:5])
        raise UsageError(
            f"Run directory {run_dir} belongs to another config: {shown}. Continuing it would not be the same training. "
            "Use the config that started it, or give this one its own run.dir (or run.name)."
        )


def _check_checkpoints(cfg: Config) -> None:
    manifest.check_tree(RunPaths(cfg.run_dir).checkpoints)
    run = resumable.RunShape(
        cfg.world_size,
        training_settings(cfg),
        resumable.installed_torch_version(),
        expected_threads(cfg),
        cfg.determinism.mode == "strict",
        cfg.checkpoint.reshard,
    )
    resumable.newest_usable(RunPaths(cfg.run_dir).checkpoints, run)


def expected_threads(cfg: Config) -> int:
    """The torch thread count each rank of this config's job will use (the rule of `legato.system.threads`)."""
    backend = backend_for(cfg.executor)
    return resolve_threads(cfg.determinism.threads, backend.tasks_per_node(cfg), backend.job_environ(cfg)).count
