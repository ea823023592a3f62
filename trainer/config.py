"""The run configuration's schema: every key, its default, its bounds and what it controls.

This is the one schema that both the trainer and the supervisor read; it is a
public contract (key names are relied on by users and outside checks). Each
section is a dataclass whose fields say, in `option(doc=...)`, what the key
controls: this file is the table of keys. `load_config` and `config_from_dict`
turn YAML (`legato.config_read`) into these sections (`legato.config_build`)
and refuse keys that disagree (`legato.config_checks`) and a config file
that leaves out a key it must say (`REQUIRED`), every mistake a
`UsageError` that names the key, the problem and the fix, before anything is
submitted or written. It must never touch the filesystem beyond reading the
YAML file and looking at (never creating) the path of the run directory.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

from legato.config_build import KEEP_LAST_MAX, MINUTES_MAX, SECONDS_MAX, STEPS_MAX, as_dict, build, option
from legato.config_checks import check_cross_fields
from legato.config_read import apply_override, read_yaml
from legato.errors import UsageError

AUTO = "auto"  # `checkpoint.every_minutes: auto`: the interval from evidence (legato.session.spacing)

__all__ = [
    "AUTO",
    "KEEP_LAST_MAX",
    "MINUTES_MAX",
    "REQUIRED",
    "SECONDS_MAX",
    "STEPS_MAX",
    "ChaosSection",
    "CheckpointSection",
    "Config",
    "DeterminismSection",
    "Fsdp2Section",
    "HangSection",
    "LocalSection",
    "ReproSection",
    "RunSection",
    "SETTINGS_ADDED_LATER",
    "SlurmSection",
    "TrainSection",
    "config_from_dict",
    "load_config",
    "training_identity",
    "training_settings",
]

SLURM_SIGNAL_CHECK_S = 30  # slurmctld looks at time limits (and sends --signal) on this fixed interval
MIN_STARTUP_MARGIN_S = 60


@dataclass
class RunSection:
    """The run's name and directory."""

    name: str = option("legato-run", doc="names the run and, unless run.dir is set, its directory")
    dir: str = option("", doc="run directory; empty means runs/<name>")


@dataclass
class LocalSection:
    """Placement of a local job (`executor: local`): ranks on this machine and a time limit."""

    tasks: int = option(2, minimum=1, maximum=1024, doc="ranks started on this machine")
    timeout_min: int = option(0, minimum=0, maximum=MINUTES_MAX, doc="local time limit per attempt, 0 for none")

    @property
    def world_size(self) -> int:
        """Ranks a local job runs: one per task."""
        return self.tasks

    def check_limits(self, source: str) -> None:
        """The local controller signals at its own time limit, with no check interval to leave room for: nothing to refuse."""


@dataclass
class SlurmSection:
    """Placement of a SLURM job (`executor: slurm`): the sbatch request, the stop signal and the requeue budget."""

    time_min: int = option(60, minimum=1, maximum=MINUTES_MAX, doc="time limit of each job (sbatch --time), in minutes")
    nodes: int = option(1, minimum=1, maximum=100_000, doc="nodes each job asks for")
    tasks_per_node: int = option(2, minimum=1, maximum=1024, doc="ranks on each node")
    cpus_per_task: int = option(1, minimum=1, maximum=4096, doc="CPUs each rank asks for")
    gpus_per_task: int = option(0, minimum=0, maximum=64, doc="GPUs each rank asks for")
    mem_gb: float = option(0.0, minimum=0, maximum=1e6, doc="memory per node in GB (sbatch --mem), 0 for the cluster's default")
    partition: str | None = option(None, doc="sbatch partition; empty for the cluster's default")
    account: str | None = option(None, doc="sbatch account; empty for the cluster's default")
    qos: str | None = option(None, doc="sbatch quality of service; empty for the cluster's default")
    signal: str = option("USR2", doc="stop signal the scheduler sends before the limit; the trainer listens for it")
    signal_lead_s: int = option(
        90, minimum=1, maximum=SECONDS_MAX, doc="seconds before the time limit the stop signal comes (--signal=USR2@90)"
    )
    master_addr: str | None = option(None, doc="address where the ranks meet; empty means the job's first node")
    handle_sigterm: bool = option(False, doc="treat SIGTERM like the stop signal too")
    max_requeues: int = option(10, minimum=0, maximum=100_000, doc="budget shared by requeues and resubmissions")
    exclude_suspect_nodes: bool = option(
        False,
        doc="a resubmission also leaves out (--exclude) the node where the ended job hung (its silent ranks' nodes) or a rank was "
        "persistently slower",
    )
    max_suspect_nodes: int = option(
        2, minimum=0, maximum=100_000, doc="most nodes exclude_suspect_nodes leaves out in one legato run session"
    )
    extra_sbatch: dict = option({}, doc="additional sbatch options, name to value")
    setup: list = option([], doc="shell lines run before the job starts")

    @property
    def world_size(self) -> int:
        """Ranks a SLURM job runs: nodes times tasks per node."""
        return self.nodes * self.tasks_per_node

    def check_limits(self, source: str) -> None:
        """SLURM may send the stop signal as soon as the time left is within the lead plus its 30 s check:
        that moment must leave the job a minute to start, or the signal can land before training began."""
        margin = self.time_min * 60 - self.signal_lead_s - SLURM_SIGNAL_CHECK_S
        if margin >= MIN_STARTUP_MARGIN_S:
            return
        need_min = -(-(self.signal_lead_s + SLURM_SIGNAL_CHECK_S + MIN_STARTUP_MARGIN_S) // 60)
        max_lead = self.time_min * 60 - SLURM_SIGNAL_CHECK_S - MIN_STARTUP_MARGIN_S
        or_lead = f", or lower slurm.signal_lead_s to {max_lead} or less" if max_lead >= 1 else ""
        raise UsageError(
            f"{source}: slurm.time_min is {self.time_min} and slurm.signal_lead_s is {self.signal_lead_s}, which leaves "
            f"{margin}s before the stop signal may arrive (time limit minus lead minus SLURM's {SLURM_SIGNAL_CHECK_S}s check interval), "
            f"but a job needs at least {MIN_STARTUP_MARGIN_S}s to start. Raise slurm.time_min to {need_min} or more{or_lead}."
        )


@dataclass
class Fsdp2Section:
    """How the bundled loop shards the model under `train.parallel: fsdp2` (torch's fully_shard, per block then the root)."""

    param_dtype: str = option(
        "float32",
        choices=("float32", "bfloat16"),
        doc="dtype the sharded parameters are gathered and computed in (MixedPrecisionPolicy.param_dtype)",
    )
    reduce_dtype: str = option(
        "float32", choices=("float32", "bfloat16"), doc="dtype gradients are reduce-scattered in (MixedPrecisionPolicy.reduce_dtype)"
    )
    reshard_after_forward: bool = option(
        True, doc="free each block's gathered parameters after its forward; false keeps them for the backward and across micro-batches"
    )
    activation_checkpointing: bool = option(False, doc="recompute each block's activations in the backward (torch.utils.checkpoint)")


@dataclass
class TrainSection:
    """What is trained and how: the task or entrypoint, its hyperparameters, device and backend."""

    task: str | None = option("tiny_gpt", choices=("tiny_gpt", "mlp", None), doc="built-in task trained when train.entrypoint is empty")
    entrypoint: str | None = option(None, doc='a user function "pkg.module:function"')
    steps: int = option(60, minimum=1, maximum=STEPS_MAX, doc="optimizer steps the whole run trains")
    batch_size: int = option(8, minimum=1, maximum=2**20, doc="samples per batch on each rank")
    lr: float = option(3e-3, minimum=0, maximum=1e3, doc="learning rate")
    warmup_steps: int = option(5, minimum=0, maximum=STEPS_MAX, doc="learning-rate warmup steps")
    num_workers: int = option(0, minimum=0, maximum=256, doc="DataLoader worker processes per rank")
    amp: bool = option(False, doc="train under autocast (mixed precision)")
    amp_dtype: str = option(
        "auto",
        choices=("auto", "bfloat16", "float16"),
        doc="autocast dtype with amp; auto is float16 on CUDA (with GradScaler), bfloat16 on CPU",
    )
    device: str = option("auto", choices=("auto", "cpu", "cuda"), doc="auto trains on CUDA when the machine has it")
    backend: str = option("auto", choices=("auto", "nccl", "gloo"), doc="auto is NCCL when each local rank has its own GPU, else gloo")
    collective_timeout_s: int = option(300, minimum=1, maximum=SECONDS_MAX, doc="how long a collective may wait for the other ranks")
    options: dict = option({}, free_text=True, doc="settings passed through to the task or entrypoint (texts may span lines)")
    parallel: str = option(
        "ddp",
        choices=("ddp", "fsdp2"),
        doc="how the bundled loop spreads the model over the ranks: replicated (DistributedDataParallel) or sharded (FSDP2's fully_shard)",
    )
    accumulate: int = option(
        1,
        minimum=1,
        maximum=4096,
        doc="micro-batches per optimizer step (gradient accumulation); each is "
        "batch_size / accumulate samples, gradients reduced after the last only",
    )
    fsdp2: Fsdp2Section = field(default_factory=Fsdp2Section)


@dataclass(frozen=True)
class CheckpointSection:
    """When checkpoints are written, how many are kept, and how a resume is checked: the config's `checkpoint:` section,
    and a Session's `CheckpointPolicy` (legato.session.policy), which is this class held to these bounds as it is
    made. One definition, one default per setting, for both doors."""

    every_steps: int = option(0, minimum=0, maximum=STEPS_MAX, doc="periodic checkpoint every N steps, 0 for off")
    # On by default, so a hard kill (node failure, OOM, SIGKILL at the time limit) loses at most this much work. Young-Daly:
    # sqrt(2 x checkpoint cost x mean time between failures) = sqrt(2 x 2.6 s x 1 day) ~ 11 min for 256 MiB at defaults
    # (2026-11-23, 2 cores); 10 minutes costs under 0.5% of the run.
    # `auto`: Young-Daly from the measured checkpoint cost and the failures the run's ledger records (legato.session.spacing).
    every_minutes: float | str = option(
        10.0,
        minimum=0,
        maximum=MINUTES_MAX,
        words=(AUTO,),
        doc="periodic checkpoint every M minutes, 0 for off; auto: from the checkpoint's measured cost and the run's failures",
    )
    keep_last: int = option(3, minimum=1, maximum=KEEP_LAST_MAX, doc="checkpoints kept; older ones are pruned")
    verify: str = option("error", choices=("error", "warn"), doc="warn turns a failed resume verification into a warning")
    # A pass over the whole state on a step that saves nothing (about 7 ms a step per GiB of state, docs/benchmarks.md),
    # and the proof does not need it: every checkpoint's manifest holds its digests. Off unless asked for; `legato verify`
    # asks for every step. Only multiples of N, so that a resumed run's trajectory equals an uninterrupted run's.
    hash_every_steps: int = option(
        0, minimum=0, maximum=STEPS_MAX, doc="write the rank state hash to the trajectory every N steps (a pass over the state); 0 for off"
    )
    agree_every_steps: int = option(
        0, minimum=0, maximum=STEPS_MAX, doc="ranks agree on stop every N steps; 0 spaces checks about a second apart"
    )
    # The default is chosen from measurements in docs/benchmarks.md.
    replay_steps: int = option(
        32, minimum=0, maximum=STEPS_MAX, doc="keep a replay base at most K steps back; a resume replays it and compares; 0 for off"
    )
    # None: on when the model lives on a GPU, where the device-to-pinned-host copy blocks about 0.01x a synchronous write
    # (docs/gpu.md); off on the CPU, where the two measured a tie end to end (docs/benchmarks.md) and the copy would only
    # cost host memory. Written by legato.store.async_checkpoint.
    async_: bool | None = option(
        None, key="async", doc="periodic checkpoints copy the state and write it in the background; unset: on when the model is on a GPU"
    )
    reshard: bool = option(
        False, doc="resume an FSDP2 checkpoint written by another world size, resharded: data position exact, not bitwise (docs/fsdp2.md)"
    )
    # Each base copies the rank's share of the state on a step that saves nothing: every 32 steps of 30 ms at 1 GiB that
    # was +11% a step. Bounded by its cost instead, the copies stay near this share of the run at any state size, and the
    # replay is longer only where the state is large (legato.session.base_clock; docs/exactness.md).
    replay_cost: float = option(
        0.02,
        minimum=0,
        maximum=1,
        doc="...and no sooner than copying the base costs at most this share of the training time; 0 for the steps rule alone",
    )
    # So that a resume replays a bounded time whatever the step time: 32 steps of 5 s were 160 s of replay, a quarter of
    # the 10-minute interval. Each new base costs a memory copy of the state (docs/exactness.md); legato.session.base_clock
    # decides when.
    replay_seconds: float | None = option(
        None,
        minimum=0,
        maximum=SECONDS_MAX,
        doc="...and at most this many seconds back (each new base is a memory copy of the state); "
        "unset: a tenth of every_minutes, or 60 s without it; 0 for the steps bound alone",
    )


@dataclass(frozen=True)
class HangSection:
    """When ranks that make no progress count as hung: the config's `hang:` section, and a Session's `HangPolicy`
    (legato.session.policy), held to these bounds as it is made. A hung attempt is ended with every rank's stacks in
    `hangs/` and resumed from its newest checkpoint (docs/hangs.md). `LEGATO_HANG` in the environment overrides it at
    launch: `off`, or `floor_s=60,phase_s=600`."""

    watchdog: bool = option(True, doc="end an attempt whose ranks all stopped making progress, with their stacks, so that it resumes")
    # No rank of the job stepped, changed its main thread's Python stack or kept a CPU busy for this long: a validation
    # on rank 0 while the others wait, or a long torch.save, is activity; a wait in a collective or on a lock is not.
    floor_s: float = option(180.0, minimum=1, maximum=SECONDS_MAX, doc="no step is judged hung sooner than this many quiet seconds")
    step_factor: float = option(
        20.0, minimum=1, maximum=10**6, doc="...nor sooner than this many times the slowest step this attempt has taken"
    )
    phase_s: float = option(
        900.0,
        minimum=1,
        maximum=SECONDS_MAX,
        doc="the quiet seconds allowed while an attempt starts, restores, replays, writes a checkpoint or ends an epoch",
    )


@dataclass
class DeterminismSection:
    """The seed and how strictly the ranks are made deterministic."""

    seed: int = option(1234, minimum=0, maximum=2**63 - 1, doc="the seed every random stream of the run derives from")
    mode: str = option("strict", choices=("strict", "fast"), doc="strict: deterministic algorithms and flags; fast: seeds only")
    threads: int = option(0, minimum=0, maximum=4096, doc="torch threads per rank, 0 for cores / local ranks")


@dataclass
class ChaosSection:
    """Fault injection for tests and demos: planted stop signals, slow steps, skipped restores, kills mid-write."""

    signal_rank: int = option(0, minimum=0, maximum=10**6, doc="the rank chaos signals; below the world size")
    signal_at_steps: list = option([], doc="after each listed step, signal_rank sends itself the stop signal")
    preempt_every_s: float = option(
        0.0,
        minimum=0,
        maximum=SECONDS_MAX,
        doc="the supervisor signals every task this many seconds after each attempt began training, 0 for off",
    )
    step_sleep_s: float = option(0.0, minimum=0, maximum=60, doc="every rank sleeps this long after each trained step (a slow node)")
    skip_restore: list = option([], doc="state components left unrestored on resume (fault injection): numpy, loader, data, optimizer, ...")
    consume_rng_after_restore: list = option(
        [], doc="draw from these RNGs (python, numpy, torch) right after the restore (fault injection)"
    )
    kill_in_checkpoint: int = option(0, minimum=0, maximum=STEPS_MAX, doc="SIGKILL every rank while writing this step's checkpoint")
    kill_point: str = option(
        "after_shards", choices=("after_shards", "after_manifest", "before_publish"), doc="where in that checkpoint write the kill comes"
    )


@dataclass
class ReproSection:
    """The environment capture at the start of each attempt and what of it is recorded."""

    enabled: bool = option(True, doc="capture the environment at the start of every attempt")
    command_timeout_s: float = option(5.0, minimum=0.1, maximum=3600, doc="limit for each external command of a capture")
    allow: list = option([], doc="variable or key names (globs) whose values are recorded; see README, Secrets")
    deny: list = option([], doc="name patterns (globs) always redacted")


@dataclass
class Config:
    """A whole run configuration: one field per YAML section, plus `executor`."""

    run: RunSection = field(default_factory=RunSection)
    executor: str = option("local", choices=("local", "slurm"), doc="where jobs run: local (this machine) or slurm")
    local: LocalSection = field(default_factory=LocalSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    hang: HangSection = field(default_factory=HangSection)
    determinism: DeterminismSection = field(default_factory=DeterminismSection)
    chaos: ChaosSection = field(default_factory=ChaosSection)
    repro: ReproSection = field(default_factory=ReproSection)

    @property
    def run_dir(self) -> Path:
        """The run directory: run.dir, else runs/<run.name>."""
        return Path(self.run.dir or f"runs/{self.run.name}")

    @property
    def placement(self) -> LocalSection | SlurmSection:
        """The section that places this config's job: the executor names it (`local:` or `slurm:`)."""
        return getattr(self, self.executor)

    @property
    def world_size(self) -> int:
        """Ranks a job of this config runs: local tasks, or SLURM nodes times tasks per node."""
        return self.placement.world_size

    def to_dict(self) -> dict:
        """The settings as YAML spells them (checkpoint.async, not the Python field name)."""
        return as_dict(self)


def training_settings(cfg: Config) -> dict:
    """Every setting that shapes the numbers a run produces (not chaos, cadence, paths or scheduler).

    A checkpoint records them; resuming under different ones is refused, naming the keys.
    """
    train = dataclasses.asdict(cfg.train)
    defaults = dataclasses.asdict(TrainSection())
    for key in SETTINGS_ADDED_LATER:
        if train[key] == defaults[key]:
            del train[key]
    return {"train": train, "determinism": dataclasses.asdict(cfg.determinism)}


# Training settings added after checkpoints already existed: recorded only away from their default, so that a run
# whose checkpoints were written before the setting existed (under what is now its default) keeps resuming.
SETTINGS_ADDED_LATER = ("parallel", "accumulate", "fsdp2")


def training_identity(cfg: Config) -> dict:
    """What makes two configs the same training: the world size (it fixes the reduction order) and the
    training settings. A run directory, its captured config and its jobs are compared by this alone."""
    return {"world_size": cfg.world_size, **training_settings(cfg)}


# What a config file must say itself (in the file or a --set): each tuple is satisfied by any one of its keys. How long to
# train, what to train and where the run lives have no default that is right for a file someone wrote: a deleted
# train.steps silently trained 60 steps, a missing train.task the tiny_gpt demo, two unnamed configs shared runs/legato-run.
REQUIRED = {
    ("train.steps",): "how many optimizer steps the run trains",
    ("train.task", "train.entrypoint"): "what is trained",
    ("run.name", "run.dir"): "where the run lives",
}


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply `key=value` overrides."""
    raw: dict = {}
    source = "the defaults"
    if path is not None:
        source = str(path)[:300]
        raw = read_yaml(Path(path))
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw, source, required=path is not None)


def _check_required(raw: dict, source: str) -> None:
    for keys, says in REQUIRED.items():
        if any(_given(raw, key) for key in keys):
            continue
        either = f" (or {' or '.join(keys[1:])})" if len(keys) > 1 else ""
        raise UsageError(
            f"{source}: {keys[0]}{either} is missing; it says {says}, and a config file must say that itself rather "
            f"than fall back to a default. Add it under {keys[0].split('.')[0]}:, or pass --set {keys[0]}=..."
        )


def _given(raw: dict, key: str) -> bool:
    section, name = key.split(".")
    return isinstance(raw.get(section), dict) and name in raw[section]


def config_from_dict(raw: dict, source: str = "config", required: bool = False) -> Config:
    """A checked `Config` from plain data as YAML spells it; `source` names where it came from in messages; `required`:
    the keys in REQUIRED must be in `raw` (a config file), rather than take their defaults (a program's own config)."""
    cfg = build(Config, raw, prefix="", source=source)
    if required:
        _check_required(raw, source)
    check_cross_fields(cfg, source)
    return cfg
