"""The rules of a run configuration that no single key can check alone.

Once every value has its type and bounds (`legato.config_build`), these look
across keys: list entries, the stop signal's spelling, the time limit against
the signal's lead, the chaos rank against the world size, the entrypoint or
task and its options, the names that reach the scheduler, and the run
directory's path. Each failure is a `UsageError` naming the key and the fix.
This module must NEVER create, write or open anything: the run directory is
only looked at, and the only values it changes are the stop signal (to its
canonical spelling) and `run.dir` (without redundant `.`, `//` and trailing
`/`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from legato.config_build import NAME_MAX, PATH_MAX, STEPS_MAX, check_list, show
from legato.errors import UsageError
from legato.system.signals import normalize_signal

if TYPE_CHECKING:
    from legato.config import Config

ENTRYPOINT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
SLURM_WORD = re.compile(r"[A-Za-z0-9_.,:+-]{1,256}")
SBATCH_OPTION = re.compile(r"[a-z][a-z0-9-]{0,63}")


def check_cross_fields(cfg: Config, source: str) -> None:
    """Refuse a built config whose keys disagree with each other; normalizes `slurm.signal` and `run.dir` in place."""
    for key, items, kind, low, high in (
        ("chaos.signal_at_steps", cfg.chaos.signal_at_steps, int, 0, STEPS_MAX),  # 0: during start-up
        ("chaos.skip_restore", cfg.chaos.skip_restore, str, None, None),
        ("chaos.consume_rng_after_restore", cfg.chaos.consume_rng_after_restore, str, None, None),
        ("slurm.setup", cfg.slurm.setup, str, None, None),
        ("repro.allow", cfg.repro.allow, str, None, None),
        ("repro.deny", cfg.repro.deny, str, None, None),
    ):
        check_list(source, key, items, kind, low, high)
    unknown_rng = [x for x in cfg.chaos.consume_rng_after_restore if x not in ("python", "numpy", "torch")]
    if unknown_rng:
        raise UsageError(f"{source}: chaos.consume_rng_after_restore holds {show(unknown_rng[0])}; it takes python, numpy and torch only.")
    try:
        cfg.slurm.signal = normalize_signal(cfg.slurm.signal)
    except UsageError as exc:
        raise UsageError(f"{source}: {exc}") from None
    cfg.placement.check_limits(source)
    if cfg.chaos.signal_at_steps and cfg.chaos.signal_rank >= cfg.world_size:
        raise UsageError(
            f"{source}: chaos.signal_rank is {cfg.chaos.signal_rank}, but this run has {cfg.world_size} ranks (0 to {cfg.world_size - 1}), "
            "so chaos.signal_at_steps would never fire. Pick a rank below the world size."
        )
    if cfg.train.entrypoint is not None and not ENTRYPOINT.fullmatch(cfg.train.entrypoint):
        raise UsageError(
            f"{source}: train.entrypoint is {show(cfg.train.entrypoint)}; it must name a module and a function as "
            '"package.module:function".'
        )
    if cfg.train.entrypoint is None and cfg.train.task is None:
        raise UsageError(f"{source}: set train.task (tiny_gpt or mlp) or train.entrypoint; both are empty.")
    if cfg.train.entrypoint is None:
        _check_task_options(cfg, source)
    _check_parallel(cfg, source)
    _check_names(cfg, source)
    _check_run_dir(cfg.run_dir, source)


def _check_task_options(cfg: Config, source: str) -> None:
    from legato.tasks.options import check_options

    assert cfg.train.task is not None  # checked first: a config without an entrypoint names its task
    try:
        check_options(cfg.train.task, cfg.train.options, cfg.world_size, cfg.train.batch_size)
    except UsageError as exc:
        raise UsageError(f"{source}: {exc}") from None


def _check_parallel(cfg: Config, source: str) -> None:
    train = cfg.train
    if train.batch_size % train.accumulate:
        raise UsageError(
            f"{source}: train.batch_size is {train.batch_size}, which train.accumulate ({train.accumulate}) does not divide "
            "into equal micro-batches. Pick a batch size that is a multiple of train.accumulate."
        )
    if train.parallel == "fsdp2" and train.amp:
        raise UsageError(
            f"{source}: train.amp is true with train.parallel: fsdp2, whose mixed precision is its own policy. Set "
            "train.amp: false and train.fsdp2.param_dtype: bfloat16 (and reduce_dtype) instead."
        )


def _check_names(cfg: Config, source: str) -> None:
    _check_run_name(cfg.run.name, source)
    if cfg.run.dir:
        cfg.run.dir = _normalized_run_dir(cfg.run.dir, source)
    for key in ("partition", "account", "qos"):
        value = getattr(cfg.slurm, key)
        if value is not None and not SLURM_WORD.fullmatch(value):
            raise UsageError(f"{source}: slurm.{key} is {show(value)}; SLURM names are letters, digits and _.,:+- only. Fix the name.")
    for option, value in cfg.slurm.extra_sbatch.items():
        if not isinstance(option, str) or not SBATCH_OPTION.fullmatch(option):
            raise UsageError(
                f"{source}: slurm.extra_sbatch has the option {show(option)}; sbatch options are words like 'constraint' or 'exclusive'."
            )
        if (
            not isinstance(value, (str, int, float, bool))
            or (isinstance(value, float) and not math.isfinite(value))
            or any(c in str(value) for c in "\x00\n\r")
        ):
            raise UsageError(f"{source}: slurm.extra_sbatch.{option} is {show(value)}; give one line of text or a number.")


def _check_run_name(name: str, source: str) -> None:
    """A name that is one directory under runs/: no '/', no surrounding blanks, not '.' or '..'."""
    problem = None
    if not name or len(name) > NAME_MAX or any(ord(c) < 32 for c in name) or name in (".", ".."):
        problem = f"it names the run and its default directory, so it must be 1 to {NAME_MAX} printable characters other than '.' and '..'"
    elif "/" in name:
        problem = "it names one directory (runs/<name>), so it cannot hold '/'; set run.dir for a directory elsewhere"
    elif name != name.strip():
        problem = "it begins or ends with a blank, which would name a directory no one can tell apart from the name without it"
    if problem:
        raise UsageError(f"{source}: run.name is {show(name)}; {problem}. Pick a short name.")


def _normalized_run_dir(text: str, source: str) -> str:
    """run.dir without redundant parts (a/./b//c/ is a/b/c); '~', '..' and surrounding blanks are refused, not guessed at."""
    problem = None
    if text.startswith("~"):
        problem = (
            "starts with '~', which legato does not expand (a shell does, but not inside YAML or quotes), so it would "
            "create a directory named '~'. Write the full path, such as $HOME/runs/<name> expanded"
        )
    elif ".." in Path(text).parts:
        problem = (
            "holds a '..' component, so where it points depends on the directory legato starts in and on symlinks. Write "
            "the path without it"
        )
    elif text != text.strip():
        problem = "begins or ends with a blank, which would be part of the directory's name. Remove the blank"
    if problem:
        raise UsageError(f"{source}: run.dir {show(text, 300)} {problem}.")
    return os.path.normpath(text)


def _check_run_dir(run_dir: Path, source: str) -> None:
    problem = run_dir_problem(run_dir)
    if problem:
        raise UsageError(
            f"{source}: run.dir {show(str(run_dir), 300)} {problem}. Set run.dir (or run.name) to a directory you can "
            "write, such as runs/<name>."
        )


def run_dir_problem(run_dir: Path) -> str | None:
    """What keeps `run_dir` from being a run directory ("is a file, not a directory"), or None: a writable directory path,
    not a file, not in a kernel filesystem, not over the OS limits. Also a Session's `run_dir` (legato.session.arguments)."""
    text = str(run_dir)
    if "\x00" in text:
        return "holds a NUL byte"
    if len(os.fsencode(text)) > PATH_MAX or any(len(os.fsencode(part)) > 255 for part in run_dir.parts):
        return f"is longer than the OS allows ({PATH_MAX} bytes in all, 255 per name)"
    absolute = Path(os.path.abspath(text))
    if absolute.parts[:2] in (("/", "proc"), ("/", "sys"), ("/", "dev")) or os.path.realpath(text).split("/")[1:2] in (
        ["proc"],
        ["sys"],
        ["dev"],
    ):
        return "is inside a kernel filesystem (/proc, /sys or /dev)"
    return _unwritable(absolute)


def _unwritable(path: Path) -> str | None:
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            return f"has a dangling symlink at {existing}"
        existing = existing.parent
    if not existing.is_dir():
        return "is a file, not a directory" if existing == path else f"lies under {existing}, which is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "is not writable" if existing == path else f"would be created in {existing}, which is not writable"
    return None
