"""What a resume changes that takes the run off its checkpoint's trajectory, each said in one paragraph with its fix.

Beyond the training settings, the kernels that run decide the bits: the torch
thread count, the CPU instruction set each rank's kernels use, the GPU model
each rank computes on, and whether the model runs compiled or eagerly. A
manifest records each; `trajectory_changes` compares them with this run's and
words what differs (for a config, or for a script's own Session). Whether a
change is refused or warned of is the caller's rule (legato.store.manifest);
a replay that diverges names them as its known cause (legato.session.resume).
This module must never import torch, and never judge what it does not know
(a value absent from an older manifest, or not known to the caller).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from legato.store.manifest_schema import COMPILED_KEY, CPU_CAPABILITY_KEY, GPUS_KEY


def trajectory_changes(
    manifest: dict,
    path: Path,
    threads: int | None,
    cpu_capabilities: Sequence[str] | None,
    compiled: bool | None,
    gpus: Sequence[str | None] | None,
    by_config: bool,
) -> list[str]:
    """What this run changes that takes it off the trajectory of checkpoint `path`, one paragraph each with its fix (worded
    for a config, or for a script's own Session): another torch thread count, CPU instruction set, GPU model, or
    compiled/eager model. None is said of what is unknown (None here, or absent from an older manifest)."""
    changes = (
        _threads_change(manifest, path, threads, by_config),
        _capability_change(manifest, path, cpu_capabilities, by_config),
        _gpu_change(manifest, path, gpus, by_config),
        _compile_switch(manifest, path, compiled),
    )
    return [change for change in changes if change]


def _threads_change(manifest: dict, path: Path, threads: int | None, by_config: bool) -> str:
    """Another torch thread count than the checkpoint's; "" when the same or unknown."""
    saved = manifest.get("threads")
    if saved is None or threads is None or saved == threads:
        return ""
    allocation = (
        "slurm.cpus_per_task on SLURM, or as many CPUs per local rank"
        if by_config
        else ("#SBATCH --cpus-per-task, or torch.set_num_threads")
    )
    return (
        f"Checkpoint {path} was written with {saved} torch threads per rank, but this run has {threads}. CPU kernels "
        "split their sums by thread count, so the run would continue on another trajectory. Give the job the "
        f"allocation it had ({saved} CPUs per task: {allocation})"
    )


def _capability_change(manifest: dict, path: Path, live: Sequence[str] | None, by_config: bool) -> str:
    """Ranks whose torch CPU kernels use another instruction set than when they wrote `path`; "" when none or unknown.

    Rank by rank: an allocation of mixed CPU kinds that wrote the checkpoint resumes on the same mix."""
    saved = [entry.get(CPU_CAPABILITY_KEY) for entry in manifest.get("ranks", [])]
    if not live or len(live) != len(saved):
        return ""  # not known here (the launcher's check), or resharded: not bitwise anyway
    # An entry of an older legato names no set: that rank is not known to have changed.
    changed = _changed_ranks((then or now, now) for then, now in zip(saved, live))
    if not changed:
        return ""
    sets = _changes_named(changed)
    pins = sorted({then for then, _ in changed})
    pin = f"ATEN_CPU_CAPABILITY={pins[0].lower()}" if len(pins) == 1 else "ATEN_CPU_CAPABILITY set to the set each wrote with"
    constraint = "slurm.extra_sbatch: {constraint: <feature>}" if by_config else "#SBATCH --constraint=<feature>"
    return (
        f"Checkpoint {path} was written by CPU kernels of another instruction set than this run's ranks use "
        f"(torch.backends.cpu.get_cpu_capability(); {sets}): the job runs on CPUs of another kind. Kernels for another "
        f"instruction set round differently, so the run would continue on another trajectory. Run the ranks with {pin} in "
        "their environment (export it before the job starts; a CPU runs any lower set), or keep the job on nodes of the CPU "
        f"kind that wrote it ({constraint}, with a feature of those nodes that `sinfo -o %f` lists)"
    )


def _gpu_change(manifest: dict, path: Path, live: Sequence[str | None] | None, by_config: bool) -> str:
    """Ranks that compute on another GPU model than when they wrote `path` (or on a GPU where they used the CPU, or the
    other way round); "" when none or unknown."""
    saved = manifest.get(GPUS_KEY)
    if saved is None or not live or len(live) != len(saved):
        return ""  # an older manifest, not known here (the launcher's check), or resharded: not bitwise anyway
    changed = _changed_ranks((then or "the CPU", now or "the CPU") for then, now in zip(saved, live))
    if not changed:
        return ""
    sets = _changes_named(changed)
    where = (
        "slurm.extra_sbatch: {constraint: <feature>} or {gres: gpu:<type>:<count>}"
        if by_config
        else ("#SBATCH --constraint=<feature> or --gres=gpu:<type>:<count>")
    )
    # A GPU tensor's digest is computed on the device by its own rule (legato.state.hashing): state that moved to or from
    # the CPU is digested by the other rule, so not even the restore can be proven.
    moved = any("the CPU" in (then, now) for then, now in changed)
    digests = (
        " The digests of state that moved between a GPU and the CPU follow another rule, so not even its restore is proven."
        if moved
        else ""
    )
    return (
        f"Checkpoint {path} was written on other devices than this run's ranks compute on ({sets}). Kernels differ between "
        f"GPU models, and between a GPU and the CPU, so the run would continue on another trajectory.{digests} Keep the job on "
        f'the devices that wrote it ({where}, with a feature or GPU type of those nodes that `sinfo -o "%f %G"` lists)'
    )


def _compile_switch(manifest: dict, path: Path, compiled: bool | None) -> str:
    """The model ran under torch.compile when it wrote `path` and runs eagerly now, or the other way round; "" when the
    same or unknown."""
    saved = manifest.get(COMPILED_KEY)
    if saved is None or compiled is None or saved == compiled:
        return ""
    then, now = ("under torch.compile", "eagerly") if saved else ("eagerly", "under torch.compile")
    return (
        f"Checkpoint {path} was written by a run whose model ran {then}, and this run's model runs {now}. Compiled and eager "
        "kernels round differently (and draw dropout's random numbers differently), so the run would continue on another "
        "trajectory. Run the model as the run that wrote it did: compile it in every attempt, or in none"
    )


def _changed_ranks(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[int]]:
    """The ranks whose (when written, now) pair differs, grouped by the pair; `pairs` in rank order."""
    changed: dict[tuple[str, str], list[int]] = {}
    for rank, (then, now) in enumerate(pairs):
        if then != now:
            changed.setdefault((then, now), []).append(rank)
    return changed


def _changes_named(changed: dict[tuple[str, str], list[int]]) -> str:
    """`ranks 1, 2: AVX512 when written, AVX2 now; rank 3: ...`"""
    return "; ".join(f"{_ranks_named(ranks)}: {then} when written, {now} now" for (then, now), ranks in changed.items())


def _ranks_named(ranks: list[int], most: int = 8) -> str:
    """`rank 3`, `ranks 0, 1`, `ranks 0, 1, 2, 3, 4, 5, 6, 7 and 56 more`."""
    shown = ", ".join(map(str, ranks[:most])) + (f" and {len(ranks) - most} more" if len(ranks) > most else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"
