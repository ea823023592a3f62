"""Everything checked before a run starts: the one entry point `legato run` and `legato verify` go through.

A config (a file and its `--set` values) is loaded and checked key by key
(`legato.config`), redacted as legato will write it, its entrypoint imported,
compared with what its run directory already holds, and its executor asked
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

from legato.config import Config, load_config
from legato.orchestrator.rundir import check_compatible, redact_config
from legato.runtime.entrypoint import check_entrypoint
from legato.slurm.backends import backend_for


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
