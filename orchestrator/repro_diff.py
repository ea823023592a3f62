"""What differs between two environment captures, section by section, as plain data.

Environment variables (added, removed, changed; the variables that only name
a job or attempt are ignored; a variable recorded only by its fingerprint is
said to have changed, never shown), Python packages with versions, git commits and
diffs, the torch/CUDA stack, GPU and driver (identity lines only: not
temperatures or clocks), OS packages, modules, hosts, config and command
line. A section with no difference produces nothing. Formatting for people
is the CLI's job; this module only reads.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from legato.errors import UsageError
from legato.paths import RunPaths
from legato.repro.capture import MANIFEST, comparable_env, read_capture
from legato.repro.redact import is_fingerprint

GPU_IDENTITY = ("Driver Version", "CUDA Version", "Product Name", "GPU UUID", "VBIOS Version", "Attached GPUs", "Serial Number")
SECTIONS = ("env", "packages", "git", "stack", "gpu", "host", "modules", "os_packages", "config", "command")


@dataclass
class SectionDiff:
    """The differing lines of one section of two captures."""

    section: str
    lines: list[str]


def resolve_capture(spec: str, run_dir: str | None) -> Path:
    """A capture directory, or `JOB[/ATTEMPT]` looked up under `<run_dir>/repro/` (newest attempt by default)."""
    path = Path(spec)
    if (path / MANIFEST).is_file():
        return path
    if run_dir is None:
        raise UsageError(f"{spec} is not a capture directory (no {MANIFEST}). Pass one, or a JOB[/ATTEMPT] with --run RUN_DIR.")
    job, _, attempt = spec.partition("/")
    job_dir = RunPaths(run_dir).repro / job
    if not job_dir.is_dir():
        raise UsageError(f"{run_dir} has no capture for job {job} (no {job_dir}). `legato status {run_dir}` lists the run's jobs.")
    if not attempt:
        attempts = sorted((p for p in job_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        attempt = attempts[-1].name if attempts else "0"
    found = job_dir / attempt
    if not (found / MANIFEST).is_file():
        raise UsageError(f"{found} holds no capture. Attempts of job {job}: {', '.join(sorted(p.name for p in job_dir.iterdir()))}.")
    return found


def diff_captures(a: Path, b: Path) -> list[SectionDiff]:
    """The sections in which captures `a` and `b` differ,, in section order."""
    left_manifest, left = read_capture(a)
    right_manifest, right = read_capture(b)
    same_key = left_manifest.get("fingerprint_key") == right_manifest.get("fingerprint_key")
    out = []
    for section in SECTIONS:
        if section == "env" and left.get(section) is not None and right.get(section) is not None:
            lines = _env_diff(comparable_env(left[section]), comparable_env(right[section]), same_key)
        else:
            lines = _diff_section(section, left.get(section), right.get(section))
        if lines:
            out.append(SectionDiff(section, lines))
    return out


def _env_diff(a: dict[str, str], b: dict[str, str], same_key: bool) -> list[str]:
    """Like a mapping diff, but a fingerprinted value is only said to have changed; fingerprints made with
    different keys (captures of different run directories) cannot be compared, which is said once."""

    def shown(name: str, value: str) -> str:
        return f"{name} (value not recorded)" if is_fingerprint(value) else f"{name}={value}"

    lines = [f"+ {shown(k, b[k])}" for k in sorted(set(b) - set(a))]
    lines += [f"- {shown(k, a[k])}" for k in sorted(set(a) - set(b))]
    incomparable = 0
    for k in sorted(set(a) & set(b)):
        if a[k] == b[k]:
            continue
        if is_fingerprint(a[k]) and is_fingerprint(b[k]):
            if same_key:
                lines.append(f"~ {k}: changed (value not recorded)")
            else:
                incomparable += 1
        elif is_fingerprint(a[k]) or is_fingerprint(b[k]):
            lines.append(f"~ {k}: changed (recorded in one capture only)")
        else:
            lines.append(f"~ {k}: {a[k]} -> {b[k]}")
    if incomparable:
        lines.append(
            f"? {incomparable} variables recorded by fingerprint only cannot be compared: the captures were keyed by different "
            "run directories"
        )
    return lines


def _diff_section(section: str, a: str | None, b: str | None) -> list[str]:
    if a is None and b is None:
        return []
    if a is None or b is None:
        return [f"only in {'the second' if a is None else 'the first'} capture"]
    if section in ("packages", "os_packages", "modules"):
        return _packages_diff(a, b) if section == "packages" else _set_diff(a, b)
    if section == "gpu":
        return _text_diff(_gpu_identity(a), _gpu_identity(b))
    if section == "host":
        return _text_diff(_without_slurm(a), _without_slurm(b))
    if section == "stack":
        return _stack_diff(a, b)
    return _text_diff(a, b)


def _mapping_diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    lines = [f"+ {k}={b[k]}" for k in sorted(set(b) - set(a))]
    lines += [f"- {k}={a[k]}" for k in sorted(set(a) - set(b))]
    lines += [f"~ {k}: {a[k]} -> {b[k]}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    return lines


def _packages_diff(a: str, b: str) -> list[str]:
    def versions(text: str) -> dict[str, str]:
        head = text.split("\n## ", 1)[0]
        pairs = (line.split("==", 1) for line in head.splitlines() if "==" in line)
        return {name: version for name, version in pairs}

    lines = _mapping_diff(versions(a), versions(b))
    tail_a, tail_b = (t.split("\n## ", 1)[1] if "\n## " in t else "" for t in (a, b))
    return lines + _text_diff(tail_a, tail_b)


def _set_diff(a: str, b: str) -> list[str]:
    left, right = set(a.splitlines()), set(b.splitlines())
    return [f"+ {x}" for x in sorted(right - left)] + [f"- {x}" for x in sorted(left - right)]


def _stack_diff(a: str, b: str) -> list[str]:
    head_a, _, rest_a = a.partition("\n\n")
    head_b, _, rest_b = b.partition("\n\n")
    try:
        lines = _mapping_diff(
            {k: json.dumps(v) for k, v in json.loads(head_a).items()}, {k: json.dumps(v) for k, v in json.loads(head_b).items()}
        )
    except json.JSONDecodeError:
        lines = _text_diff(head_a, head_b)
    return lines + _text_diff(rest_a, rest_b)


def _gpu_identity(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip().startswith(GPU_IDENTITY))


def _without_slurm(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("SLURM_"))


def _text_diff(a: str, b: str) -> list[str]:
    if a == b:
        return []
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "first", "second", lineterm="", n=1)
    return [line for line in diff if not line.startswith(("---", "+++"))]
