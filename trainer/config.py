"""The run configuration: YAML in, typed and validated settings out.

This is the one schema that both the trainer and the supervisor read; it is a
public contract (key names are relied on by users and outside checks). It
turns every mistake into a `UsageError` that names the key, the problem and
the fix. It must never touch the filesystem beyond reading the YAML file.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from legato.errors import UsageError


def _opt(default: Any, *, choices: tuple = (), minimum: float | None = None, doc: str = "") -> Any:
    meta = {"choices": choices, "minimum": minimum, "doc": doc}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunSection:
    name: str = _opt("legato-run")
    dir: str = _opt("", doc="run directory; empty means runs/<name>")


@dataclass
class LocalSection:
    tasks: int = _opt(2, minimum=1, doc="ranks started on this machine")
    timeout_min: int = _opt(0, minimum=0, doc="local time limit per attempt, 0 for none")


@dataclass
class SlurmSection:
    time_min: int = _opt(60, minimum=1)
    nodes: int = _opt(1, minimum=1)
    tasks_per_node: int = _opt(2, minimum=1)
    cpus_per_task: int = _opt(1, minimum=1)
    gpus_per_task: int = _opt(0, minimum=0)
    mem_gb: float = _opt(0.0, minimum=0)
    partition: str | None = _opt(None)
    account: str | None = _opt(None)
    qos: str | None = _opt(None)
    signal: str = _opt("USR2", doc="stop signal the scheduler sends before the limit; the trainer listens for it")
    signal_lead_s: int = _opt(90, minimum=1)
    handle_sigterm: bool = _opt(False, doc="treat SIGTERM like the stop signal too")
    max_requeues: int = _opt(10, minimum=0)
    extra_sbatch: dict = _opt({}, doc="additional sbatch options, name to value")
    setup: list = _opt([], doc="shell lines run before the job starts")


@dataclass
class TrainSection:
    task: str | None = _opt("tiny_gpt", choices=("tiny_gpt", "mlp", None))
    entrypoint: str | None = _opt(None, doc='a user function "pkg.module:function"')
    steps: int = _opt(60, minimum=1)
    batch_size: int = _opt(8, minimum=1)
    lr: float = _opt(3e-3, minimum=0)
    warmup_steps: int = _opt(5, minimum=0)
    num_workers: int = _opt(0, minimum=0)
    amp: bool = _opt(False)
    collective_timeout_s: int = _opt(300, minimum=1)
    options: dict = _opt({}, doc="settings passed through to the task or entrypoint")


@dataclass
class CheckpointSection:
    every_steps: int = _opt(0, minimum=0, doc="periodic checkpoint every N steps, 0 for off")
    every_minutes: float = _opt(0.0, minimum=0, doc="periodic checkpoint every M minutes, 0 for off")
    keep_last: int = _opt(3, minimum=1)
    verify: str = _opt("error", choices=("error", "warn"))
    hash_every_steps: int = _opt(10, minimum=0, doc="write the rank state hash to the trajectory every N steps")
    agree_every_steps: int = _opt(0, minimum=0, doc="ranks agree on stop every N steps; 0 spaces checks about a second apart")
    replay_steps: int = _opt(32, minimum=0, doc="keep a replay base at most K steps back; a resume replays it and compares; 0 for off")


@dataclass
class DeterminismSection:
    seed: int = _opt(1234, minimum=0)
    mode: str = _opt("strict", choices=("strict", "fast"))
    threads: int = _opt(0, minimum=0, doc="torch threads per rank, 0 for cores / local ranks")


@dataclass
class ChaosSection:
    signal_rank: int = _opt(0, minimum=0)
    signal_at_steps: list = _opt([], doc="after each listed step, signal_rank sends itself the stop signal")
    preempt_every_s: float = _opt(0.0, minimum=0)
    skip_restore: list = _opt([], doc="state components left unrestored on resume (fault injection): numpy, loader, data, optimizer, ...")
    consume_rng_after_restore: list = _opt([], doc="draw from these RNGs (python, numpy, torch) right after the restore (fault injection)")
    kill_in_checkpoint: int = _opt(0, minimum=0, doc="SIGKILL every rank while writing this step's checkpoint")
    kill_point: str = _opt("after_shards", choices=("after_shards", "after_manifest", "before_publish"))


@dataclass
class ReproSection:
    enabled: bool = _opt(True, doc="capture the environment at the start of every attempt")
    command_timeout_s: float = _opt(5.0, minimum=0.1, doc="limit for each external command of a capture")
    allow: list = _opt([], doc="variable or key names never redacted")
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
    def world_size(self) -> int:
        """Ranks a job of this config runs: local tasks, or SLURM nodes times tasks per node."""
        return self.local.tasks if self.executor == "local" else self.slurm.nodes * self.slurm.tasks_per_node

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def training_settings(cfg: Config) -> dict:
    """Every setting that shapes the numbers a run produces (not chaos, cadence, paths or scheduler).

    A checkpoint records them; resuming under different ones is refused, naming the keys.
    """
    return {"train": dataclasses.asdict(cfg.train), "determinism": dataclasses.asdict(cfg.determinism)}


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply `key=value` overrides."""
    raw: dict = {}
    source = "the defaults"
    if path is not None:
        source = str(path)
        raw = _read_yaml(Path(path))
    for item in overrides:
        _apply_override(raw, item)
    return config_from_dict(raw, source)


def config_from_dict(raw: dict, source: str = "config") -> Config:
    cfg = _build(Config, raw, prefix="", source=source)
    _check_cross_fields(cfg, source)
    return cfg


def _check_cross_fields(cfg: Config, source: str) -> None:
    import signal

    for key, items, kind in (
        ("chaos.signal_at_steps", cfg.chaos.signal_at_steps, int),
        ("chaos.skip_restore", cfg.chaos.skip_restore, str),
        ("chaos.consume_rng_after_restore", cfg.chaos.consume_rng_after_restore, str),
        ("slurm.setup", cfg.slurm.setup, str),
        ("repro.allow", cfg.repro.allow, str),
        ("repro.deny", cfg.repro.deny, str),
    ):
        bad = [x for x in items if not isinstance(x, kind) or isinstance(x, bool)]
        if bad:
            raise UsageError(f"{source}: {key} must be a list of {_TYPE_WORDS[kind][2:]}s, but it holds {bad[0]!r}. Fix that entry.")
    name = cfg.slurm.signal.upper().removeprefix("SIG")
    if not hasattr(signal, f"SIG{name}"):
        raise UsageError(f"{source}: slurm.signal is {cfg.slurm.signal!r}, which is not a signal name. Use USR1, USR2, TERM or similar.")
    cfg.slurm.signal = name
    if cfg.train.entrypoint is not None and ":" not in cfg.train.entrypoint:
        raise UsageError(
            f'{source}: train.entrypoint is {cfg.train.entrypoint!r}; it must name a module and a function as "package.module:function".'
        )
    if cfg.train.entrypoint is None and cfg.train.task is None:
        raise UsageError(f"{source}: set train.task (tiny_gpt or mlp) or train.entrypoint; both are empty.")


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise UsageError(f"Config file {path} does not exist. Pass the path of a YAML config, for example configs/tiny_gpt.yaml.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(f"{path} is not valid YAML{where}: {exc.problem}. Fix the syntax there (indentation, a missing colon or quote).") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML: {exc}. Fix the syntax.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a mapping of sections (run:, train:, ...), not a {type(data).__name__}.")
    return data


def _apply_override(raw: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set {item!r} is not of the form key=value, for example --set train.steps=100.")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UsageError(f"--set {item!r}: the value {text!r} is not valid YAML. Quote it if it is a string.") from None
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UsageError(f"--set {item!r}: {part} is not a section, so it has no key {parts[-1]!r}.")
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    label = prefix.rstrip(".") or "the top level"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: {label} must be a mapping of keys, not {raw!r}. Write it as a YAML section.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = str(unknown[0])
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
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, raw[name], f"{prefix}{name}.", source)
        else:
            values[name] = _check_value(f"{prefix}{name}", raw[name], hint, f.metadata, source)
    return cls(**values)


def _check_value(key: str, value: Any, hint: Any, meta: Any, source: str) -> Any:
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    base = next(t for t in allowed if t is not type(None))
    value = _coerce(key, value, base, source)
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        shown = ", ".join(str(c) for c in choices if c is not None)
        raise UsageError(f"{source}: {key} is {value!r}, which is not one of: {shown}. Pick one of those.")
    minimum = meta.get("minimum")
    if minimum is not None and value < minimum:
        floor = "positive" if minimum == 1 else f"at least {minimum}"
        raise UsageError(f"{source}: {key} is {value!r}, but it must be {floor}. Set a value of {minimum} or more.")
    return value


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "a mapping"}


def _coerce(key: str, value: Any, base: type, source: str) -> Any:
    ok = isinstance(value, base) and not (base in (int, float) and isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is float and isinstance(value, str):
        # PyYAML follows YAML 1.1, which reads 1e-3 (no dot) as a string.
        try:
            return float(value)
        except ValueError:
            pass
    if not ok:
        raise UsageError(
            f"{source}: {key} must be {_TYPE_WORDS[base]}, but it is {value!r} ({type(value).__name__}). "
            f"Write it as {_TYPE_WORDS[base]}, without quotes for numbers and booleans."
        )
    return value
