"""The run configuration: YAML in, typed and validated settings out.

This is the one schema that both the trainer and the supervisor read; it is a
public contract (key names are relied on by users and outside checks). It
turns every mistake into a `UsageError` that names the key, the problem and
the fix, before anything is submitted or written. It must never touch the
filesystem beyond reading the YAML file and looking at (never creating) the
path of the run directory.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import stat
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legato import safeyaml
from legato.errors import UsageError
from legato.runtime.signals import normalize_signal


def _opt(default: Any, *, choices: tuple = (), minimum: float | None = None, maximum: float | None = None, doc: str = "", key: str = "") -> Any:
    """A config field; `key` spells its YAML name where that is a Python keyword (checkpoint.async)."""
    meta = {"choices": choices, "minimum": minimum, "maximum": maximum, "doc": doc, "key": key}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# Ceilings far above any real run, low enough that no count, size or time overflows or hangs what uses it.
STEPS_MAX = 10**9
KEEP_LAST_MAX = 100_000
SECONDS_MAX = 7 * 24 * 3600
MINUTES_MAX = 366 * 24 * 60
NAME_MAX = 200
MAX_TEXT = 4096
MAX_LIST = 10_000
MAX_OVERRIDE = 64 * 1024
PATH_MAX = 4096
SLURM_SIGNAL_CHECK_S = 30  # slurmctld looks at time limits (and sends --signal) on this fixed interval
MIN_STARTUP_MARGIN_S = 60
ENTRYPOINT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
OVERRIDE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
SLURM_WORD = re.compile(r"[A-Za-z0-9_.,:+-]{1,256}")
SBATCH_OPTION = re.compile(r"[a-z][a-z0-9-]{0,63}")


@dataclass
class RunSection:
    name: str = _opt("legato-run")
    dir: str = _opt("", doc="run directory; empty means runs/<name>")


@dataclass
class LocalSection:
    tasks: int = _opt(2, minimum=1, maximum=1024, doc="ranks started on this machine")
    timeout_min: int = _opt(0, minimum=0, maximum=MINUTES_MAX, doc="local time limit per attempt, 0 for none")

    @property
    def world_size(self) -> int:
        """Ranks a local job runs: one per task."""
        return self.tasks

    def check_limits(self, source: str) -> None:
        """The local controller signals at its own time limit, with no check interval to leave room for: nothing to refuse."""


@dataclass
class SlurmSection:
    time_min: int = _opt(60, minimum=1, maximum=MINUTES_MAX)
    nodes: int = _opt(1, minimum=1, maximum=100_000)
    tasks_per_node: int = _opt(2, minimum=1, maximum=1024)
    cpus_per_task: int = _opt(1, minimum=1, maximum=4096)
    gpus_per_task: int = _opt(0, minimum=0, maximum=64)
    mem_gb: float = _opt(0.0, minimum=0, maximum=1e6)
    partition: str | None = _opt(None)
    account: str | None = _opt(None)
    qos: str | None = _opt(None)
    signal: str = _opt("USR2", doc="stop signal the scheduler sends before the limit; the trainer listens for it")
    signal_lead_s: int = _opt(90, minimum=1, maximum=SECONDS_MAX)
    master_addr: str | None = _opt(None, doc="address where the ranks meet; empty means the job's first node")
    handle_sigterm: bool = _opt(False, doc="treat SIGTERM like the stop signal too")
    max_requeues: int = _opt(10, minimum=0, maximum=100_000)
    extra_sbatch: dict = _opt({}, doc="additional sbatch options, name to value")
    setup: list = _opt([], doc="shell lines run before the job starts")

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
class TrainSection:
    task: str | None = _opt("tiny_gpt", choices=("tiny_gpt", "mlp", None))
    entrypoint: str | None = _opt(None, doc='a user function "pkg.module:function"')
    steps: int = _opt(60, minimum=1, maximum=STEPS_MAX)
    batch_size: int = _opt(8, minimum=1, maximum=2**20)
    lr: float = _opt(3e-3, minimum=0, maximum=1e3)
    warmup_steps: int = _opt(5, minimum=0, maximum=STEPS_MAX)
    num_workers: int = _opt(0, minimum=0, maximum=256)
    amp: bool = _opt(False)
    amp_dtype: str = _opt("auto", choices=("auto", "bfloat16", "float16"), doc="autocast dtype with amp; auto is float16 on CUDA (with GradScaler), bfloat16 on CPU")
    device: str = _opt("auto", choices=("auto", "cpu", "cuda"), doc="auto trains on CUDA when the machine has it")
    backend: str = _opt("auto", choices=("auto", "nccl", "gloo"), doc="auto is NCCL when each local rank has its own GPU, else gloo")
    collective_timeout_s: int = _opt(300, minimum=1, maximum=SECONDS_MAX)
    options: dict = _opt({}, doc="settings passed through to the task or entrypoint")


@dataclass
class CheckpointSection:
    every_steps: int = _opt(0, minimum=0, maximum=STEPS_MAX, doc="periodic checkpoint every N steps, 0 for off")
    every_minutes: float = _opt(0.0, minimum=0, maximum=MINUTES_MAX, doc="periodic checkpoint every M minutes, 0 for off")
    keep_last: int = _opt(3, minimum=1, maximum=KEEP_LAST_MAX)
    verify: str = _opt("error", choices=("error", "warn"))
    hash_every_steps: int = _opt(10, minimum=0, maximum=STEPS_MAX, doc="write the rank state hash to the trajectory every N steps")
    agree_every_steps: int = _opt(0, minimum=0, maximum=STEPS_MAX, doc="ranks agree on stop every N steps; 0 spaces checks about a second apart")
    replay_steps: int = _opt(32, minimum=0, maximum=STEPS_MAX, doc="keep a replay base at most K steps back; a resume replays it and compares; 0 for off")
    async_: bool | None = _opt(
        None, key="async", doc="periodic checkpoints copy the state and write it in the background; unset: on when the model is on a GPU"
    )


@dataclass
class DeterminismSection:
    seed: int = _opt(1234, minimum=0, maximum=2**63 - 1)
    mode: str = _opt("strict", choices=("strict", "fast"))
    threads: int = _opt(0, minimum=0, maximum=4096, doc="torch threads per rank, 0 for cores / local ranks")


@dataclass
class ChaosSection:
    signal_rank: int = _opt(0, minimum=0, maximum=10**6, doc="the rank chaos signals; below the world size")
    signal_at_steps: list = _opt([], doc="after each listed step, signal_rank sends itself the stop signal")
    preempt_every_s: float = _opt(0.0, minimum=0, maximum=SECONDS_MAX)
    step_sleep_s: float = _opt(0.0, minimum=0, maximum=60, doc="every rank sleeps this long after each trained step (a slow node)")
    skip_restore: list = _opt([], doc="state components left unrestored on resume (fault injection): numpy, loader, data, optimizer, ...")
    consume_rng_after_restore: list = _opt([], doc="draw from these RNGs (python, numpy, torch) right after the restore (fault injection)")
    kill_in_checkpoint: int = _opt(0, minimum=0, maximum=STEPS_MAX, doc="SIGKILL every rank while writing this step's checkpoint")
    kill_point: str = _opt("after_shards", choices=("after_shards", "after_manifest", "before_publish"))


@dataclass
class ReproSection:
    enabled: bool = _opt(True, doc="capture the environment at the start of every attempt")
    command_timeout_s: float = _opt(5.0, minimum=0.1, maximum=3600, doc="limit for each external command of a capture")
    allow: list = _opt([], doc="variable or key names (globs) whose values are recorded; see README, Secrets")
    deny: list = _opt([], doc="name patterns (globs) always redacted")


@dataclass
class Config:
    run: RunSection = field(default_factory=RunSection)
    executor: str = _opt("local", choices=("local", "slurm"))
    local: LocalSection = field(default_factory=LocalSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    determinism: DeterminismSection = field(default_factory=DeterminismSection)
    chaos: ChaosSection = field(default_factory=ChaosSection)
    repro: ReproSection = field(default_factory=ReproSection)

    @property
    def run_dir(self) -> Path:
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
        return _as_dict(self)


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def _as_dict(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {_key(f): _as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return copy.deepcopy(value)


def training_settings(cfg: Config) -> dict:
    """Every setting that shapes the numbers a run produces (not chaos, cadence, paths or scheduler).

    A checkpoint records them; resuming under different ones is refused, naming the keys.
    """
    return {"train": dataclasses.asdict(cfg.train), "determinism": dataclasses.asdict(cfg.determinism)}


def training_identity(cfg: Config) -> dict:
    """What makes two configs the same training: the world size (it fixes the reduction order) and the
    training settings. A run directory, its captured config and its jobs are compared by this alone."""
    return {"world_size": cfg.world_size, **training_settings(cfg)}


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply `key=value` overrides."""
    raw: dict = {}
    source = "the defaults"
    if path is not None:
        source = str(path)[:300]
        raw = _read_yaml(Path(path))
    for item in overrides:
        _apply_override(raw, item)
    return config_from_dict(raw, source)


def config_from_dict(raw: dict, source: str = "config") -> Config:
    cfg = _build(Config, raw, prefix="", source=source)
    _check_cross_fields(cfg, source)
    return cfg


def _check_cross_fields(cfg: Config, source: str) -> None:
    for key, items, kind, low, high in (
        ("chaos.signal_at_steps", cfg.chaos.signal_at_steps, int, 0, STEPS_MAX),  # 0: during start-up
        ("chaos.skip_restore", cfg.chaos.skip_restore, str, None, None),
        ("chaos.consume_rng_after_restore", cfg.chaos.consume_rng_after_restore, str, None, None),
        ("slurm.setup", cfg.slurm.setup, str, None, None),
        ("repro.allow", cfg.repro.allow, str, None, None),
        ("repro.deny", cfg.repro.deny, str, None, None),
    ):
        _check_list(source, key, items, kind, low, high)
    unknown_rng = [x for x in cfg.chaos.consume_rng_after_restore if x not in ("python", "numpy", "torch")]
    if unknown_rng:
        raise UsageError(f"{source}: chaos.consume_rng_after_restore holds {_show(unknown_rng[0])}; it takes python, numpy and torch only.")
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
            f'{source}: train.entrypoint is {_show(cfg.train.entrypoint)}; it must name a module and a function as "package.module:function".'
        )
    if cfg.train.entrypoint is None and cfg.train.task is None:
        raise UsageError(f"{source}: set train.task (tiny_gpt or mlp) or train.entrypoint; both are empty.")
    if cfg.train.entrypoint is None:
        _check_task_options(cfg, source)
    _check_names(cfg, source)
    _check_run_dir(cfg.run_dir, source)


def _check_list(source: str, key: str, items: list, kind: type, low: int | None, high: int | None) -> None:
    if len(items) > MAX_LIST:
        raise UsageError(f"{source}: {key} holds {len(items)} entries; at most {MAX_LIST} make sense. Shorten it.")
    bad = [x for x in items if not isinstance(x, kind) or isinstance(x, bool)]
    if bad:
        raise UsageError(f"{source}: {key} must be a list of {_TYPE_WORDS[kind][2:]}s, but it holds {_show(bad[0])}. Fix that entry.")
    if kind is str:
        bad = [x for x in items if "\x00" in x or len(x) > MAX_TEXT]
        if bad:
            raise UsageError(f"{source}: {key} holds an entry with a NUL byte or over {MAX_TEXT} characters. Fix that entry.")
        return
    bad = [x for x in items if (low is not None and x < low) or (high is not None and x > high)]
    if bad:
        raise UsageError(f"{source}: {key} holds {_show(bad[0])}; its entries must be from {low} to {high}. Fix that entry.")


def _check_task_options(cfg: Config, source: str) -> None:
    from legato.tasks.options import check_options

    try:
        check_options(cfg.train.task, cfg.train.options, cfg.world_size)
    except UsageError as exc:
        raise UsageError(f"{source}: {exc}") from None


def _check_names(cfg: Config, source: str) -> None:
    name = cfg.run.name
    if not name or len(name) > NAME_MAX or any(ord(c) < 32 for c in name) or name in (".", ".."):
        raise UsageError(
            f"{source}: run.name is {_show(name)}; it names the run and its default directory, so it must be 1 to {NAME_MAX} "
            "printable characters other than '.' and '..'. Pick a short name."
        )
    for key in ("partition", "account", "qos"):
        value = getattr(cfg.slurm, key)
        if value is not None and not SLURM_WORD.fullmatch(value):
            raise UsageError(f"{source}: slurm.{key} is {_show(value)}; SLURM names are letters, digits and _.,:+- only. Fix the name.")
    for option, value in cfg.slurm.extra_sbatch.items():
        if not isinstance(option, str) or not SBATCH_OPTION.fullmatch(option):
            raise UsageError(f"{source}: slurm.extra_sbatch has the option {_show(option)}; sbatch options are words like 'constraint' or 'exclusive'.")
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, float) and not math.isfinite(value)) or any(c in str(value) for c in "\x00\n\r"):
            raise UsageError(f"{source}: slurm.extra_sbatch.{option} is {_show(value)}; give one line of text or a number.")


def _check_run_dir(run_dir: Path, source: str) -> None:
    """A writable directory path: not a file, not in a kernel filesystem, not over the OS limits."""
    text = str(run_dir)
    problem = None
    if "\x00" in text:
        problem = "holds a NUL byte"
    elif len(os.fsencode(text)) > PATH_MAX or any(len(os.fsencode(part)) > 255 for part in run_dir.parts):
        problem = f"is longer than the OS allows ({PATH_MAX} bytes in all, 255 per name)"
    if problem is None:
        absolute = Path(os.path.abspath(text))
        if absolute.parts[:2] in (("/", "proc"), ("/", "sys"), ("/", "dev")) or os.path.realpath(text).split("/")[1:2] in (["proc"], ["sys"], ["dev"]):
            problem = "is inside a kernel filesystem (/proc, /sys or /dev)"
        else:
            problem = _unwritable(absolute)
    if problem:
        raise UsageError(f"{source}: run.dir {_show(text, 300)} {problem}. Set run.dir (or run.name) to a directory you can write, such as runs/<name>.")


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


def _read_yaml(path: Path) -> dict:
    text = _read_text(path)
    if not text.strip() or all(line.lstrip().startswith("#") for line in text.splitlines() if line.strip()):
        raise UsageError(f"{path} is empty. A config needs at least its sections; start from configs/tiny_gpt.yaml.")
    data = safeyaml.load(text, str(path))
    if data is None:
        raise UsageError(f"{path} holds an empty document. A config needs at least its sections; start from configs/tiny_gpt.yaml.")
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a mapping of sections (run:, train:, ...), not a {type(data).__name__}.")
    return data


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; never more than the size limit is read, and nothing that is not a regular file is opened."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        info = None
    if info is None:
        raise UsageError(f"Config file {_show_path(path)} does not exist. Pass the path of a YAML config, for example configs/tiny_gpt.yaml.")
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path} is not a regular file (a directory, device or pipe). Pass the path of a YAML config file.")
    try:
        with open(path, "rb") as f:
            data = f.read(safeyaml.MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"Config file {path} cannot be read ({exc.strerror}). Check its permissions.") from None
    if len(data) > safeyaml.MAX_BYTES:
        raise UsageError(f"{path} is larger than {safeyaml.MAX_BYTES // 1024} KiB, far beyond any config. Pass the config file itself, not data.")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        raise UsageError(f"{path} is a binary or UTF-16 file. Save the config as plain UTF-8 text.")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start} is not valid). Save the config as plain UTF-8 text.") from None


def _apply_override(raw: dict, item: str) -> None:
    # Messages name the key, never the value: a value may be a secret typed under a wrong or mistyped key.
    if not isinstance(item, str) or len(item) > MAX_OVERRIDE or "\x00" in item:
        key = item.partition("=")[0] if isinstance(item, str) else item
        raise UsageError(f"--set {_show(key)}=... is longer than {MAX_OVERRIDE} characters or holds a NUL byte. Put large values in the config file.")
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set {_show(item)} is not of the form key=value, for example --set train.steps=100.")
    parts = key.strip().split(".")
    if not all(OVERRIDE_KEY.fullmatch(part) for part in parts):
        raise UsageError(f"--set {_show(key)} is not a dotted key such as train.steps. Fix the key.")
    value = safeyaml.load(text, f"--set {_show(key)}: the value")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UsageError(f"--set {_show(key)}: {part} is not a section, so it has no key {parts[-1]!r}.")
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    label = prefix.rstrip(".") or "the top level"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: {label} must be a mapping of keys, not {_show(raw)}. Write it as a YAML section.")
    hints = typing.get_type_hints(cls)
    fields = {_key(f): f for f in dataclasses.fields(cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = str(unknown[0])[:60]
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f" Did you mean {prefix}{close[0]}?" if close else ""
        raise UsageError(
            f"{source}: {prefix}{key} is not a known key.{hint} Valid keys in {label}: "
            f"{', '.join(fields)}. Fix or remove the key."
        )
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            values[f.name] = _build(hint, raw[name], f"{prefix}{name}.", source)
        else:
            values[f.name] = _check_value(f"{prefix}{name}", raw[name], hint, f.metadata, source)
    return cls(**values)


def _check_value(key: str, value: Any, hint: Any, meta: Any, source: str) -> Any:
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    base = next(t for t in allowed if t is not type(None))
    value = _coerce(key, value, base, source)
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{source}: {key} is {value!r}; it must be a finite number. Write a number such as {meta.get('minimum') or 1}.")
    if isinstance(value, str) and ("\x00" in value or len(value) > MAX_TEXT):
        raise UsageError(f"{source}: {key} holds a NUL byte or is longer than {MAX_TEXT} characters. Write a short value.")
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        shown = ", ".join(str(c) for c in choices if c is not None)
        raise UsageError(f"{source}: {key} is {_show(value)}, which is not one of: {shown}. Pick one of those.")
    minimum, maximum = meta.get("minimum"), meta.get("maximum")
    if minimum is not None and value < minimum:
        floor = "positive" if minimum == 1 else f"at least {minimum}"
        raise UsageError(f"{source}: {key} is {_show(value)}, but it must be {floor}. Set a value of {minimum} or more.")
    if maximum is not None and value > maximum:
        raise UsageError(f"{source}: {key} is {_show(value)}, beyond the largest sensible value, {maximum:g}. Set a value of at most {maximum:g}.")
    return value


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "a mapping"}


def _coerce(key: str, value: Any, base: type, source: str) -> Any:
    ok = isinstance(value, base) and not (base in (int, float) and isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise UsageError(f"{source}: {key} is {_show(value)}, beyond any sensible value. Write a number of sensible size.") from None
    if base is float and isinstance(value, str):
        # PyYAML follows YAML 1.1, which reads 1e-3 (no dot) as a string.
        try:
            return float(value)
        except ValueError:
            pass
    if not ok:
        raise UsageError(
            f"{source}: {key} must be {_TYPE_WORDS[base]}, but it is {_show(value)} ({type(value).__name__}). "
            f"Write it as {_TYPE_WORDS[base]}, without quotes for numbers and booleans."
        )
    return value


def _show_path(path: Path) -> str:
    text = str(path)
    if any(ord(c) < 32 for c in text):
        text = repr(text)
    return text if len(text) <= 300 else text[:297] + "..."


def _show(value: Any, limit: int = 60) -> str:
    """A value as a message may quote it: short, one line, never a huge number spelled out."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
