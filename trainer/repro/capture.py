"""Capture what is needed to reproduce a job, on the node where it runs, as plain files with a manifest.

One capture is a directory (`<run.dir>/repro/<job_id>/<attempt>/` under
`legato run`) of sections, each a text file: environment variables
(values by allowlist, every other one as a keyed fingerprint), Python distributions (and where editable ones come from, with
their commit and diff), the git state of the user's code and of legato,
the Python/torch/CUDA/cuDNN/NCCL stack, GPUs (`nvidia-smi -q`), environment
modules, OS packages, the host, the resolved config and the command line.
`manifest.json` lists the sections with a digest each (what `diff` and
`legato status` compare), the external commands with their outcome and time,
and the capture time. External commands run side by side, each with a
timeout; a failure or a hang is recorded, never raised. Nothing a capture
writes may contain a secret: every value passes through the `Redactor`, whose
fingerprint key lives beside the captures it serves (`repro/fingerprint.key`
of the run), never inside a section.
"""

from __future__ import annotations

import dataclasses
import email.parser
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from legato.repro.redact import Redactor, is_fingerprint, key_id
from legato.system.processes import run_command

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
# Identity of one job or attempt, not of its environment: recorded, but not a difference.
VOLATILE_ENV = (
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_RESTART_COUNT",
    "SLURM_TASK_PID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_LAUNCHER_PORT",
    "SLURM_SRUN_COMM_PORT",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_SUBMIT_DIR",
    "SLURM_SCRIPT_CONTEXT",
    "SUBMITIT_LOCAL_JOB_ID",
    "SUBMITIT_FOLDER",
    "SUBMITIT_LOCAL_GLOBALID",
    "SUBMITIT_LOCAL_LOCALID",
    "SUBMITIT_LOCAL_NODEID",
    "RANK",
    "LOCAL_RANK",
    "MASTER_PORT",
    "OLDPWD",
    "_",
    "SHLVL",
    "TMUX_PANE",
    "TERM_SESSION_ID",
    "SSH_CLIENT",
    "SSH_CONNECTION",
    "SSH_TTY",
)


@dataclass(frozen=True)
class CaptureRequest:
    """What to capture besides the environment itself."""

    dest: Path
    redactor: Redactor
    command_timeout_s: float = 5.0
    config: dict | None = None
    argv: tuple[str, ...] = ()
    code_paths: tuple[Path, ...] = ()
    labels: dict | None = None
    threads: str | None = None  # the torch thread count per rank and where it came from (legato.system.threads)
    stack: str | None = None  # the stack section, read by a process that has torch imported already (`stack_text`)


def capture(req: CaptureRequest) -> dict:
    """Write one capture into `req.dest`; returns its manifest."""
    started = time.monotonic()
    req.dest.mkdir(parents=True, exist_ok=True)
    r = req.redactor
    commands: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(_command, cmd, req.command_timeout_s) for name, cmd in _external_commands().items()}
        sections = {
            "env": _env_text(r),
            "packages": _packages(r, req.command_timeout_s),
            "git": _git_sections(r, req.code_paths, req.command_timeout_s),
            "stack": req.stack or stack_text(),
            "host": _host(r, req.threads),
            "config": json.dumps(r.tree(req.config), indent=2, sort_keys=True) + "\n" if req.config is not None else None,
            "command": "\n".join(r.argv(list(req.argv))) + "\n" if req.argv else None,
        }
        for name, future in futures.items():
            result = future.result()
            commands[name] = {k: v for k, v in result.items() if k != "output"}
            if result.get("output") is not None:
                sections[name] = r.text(result["output"])
    files = {}
    for name, text in sections.items():
        if text is None:
            continue
        path = req.dest / f"{name}.txt"
        path.write_text(text)
        files[name] = {"file": path.name, "sha256": hashlib.sha256(_comparable(name, text).encode()).hexdigest()}
    manifest = {
        "format": FORMAT,
        "labels": r.tree(req.labels or {}),
        "fingerprint_key": key_id(r.key),
        "host": socket.gethostname(),
        "time": time.time(),
        "sections": files,
        "commands": commands,
        "capture_seconds": round(time.monotonic() - started, 3),
    }
    (req.dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_capture(path: Path) -> tuple[dict, dict[str, str]]:
    """A capture's manifest and its section texts."""
    manifest = json.loads((path / MANIFEST).read_text())
    texts = {name: (path / info["file"]).read_text() for name, info in manifest["sections"].items()}
    return manifest, texts


def comparable_env(text: str) -> dict[str, str]:
    """The env section as name -> value, without the variables that name the job rather than its environment."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name and name not in VOLATILE_ENV:
            out[name] = value
    return out


def _comparable(section: str, text: str) -> str:
    if section == "env":
        return "\n".join(f"{k}={v}" for k, v in sorted(comparable_env(text).items()))
    if section == "host":
        return "\n".join(line for line in text.splitlines() if not line.startswith(("SLURM_", "uptime")))
    return text


# -- sections ------------------------------------------------------------------


def _env_text(r: Redactor) -> str:
    return "".join(f"{name}={value}\n" for name, value in r.environ(dict(os.environ)).items())


def _packages(r: Redactor, timeout: float) -> str:
    """One line per distribution, `pip freeze` style; editable installs with their source, commit and diff."""
    lines, editable = [], []
    seen = set()
    for dist in importlib.metadata.distributions():
        name, version = _name_and_version(dist)
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        source = _editable_source(dist)
        if source is None:
            lines.append(f"{name}=={version}")
            continue
        lines.append(f"{name}=={version} (editable: {source})")
        editable.append(_git_state(f"editable {name}", Path(source), r, timeout))
    return "\n".join(sorted(lines, key=str.lower)) + "\n" + "".join(editable)


def _name_and_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """`dist.metadata["Name"]` and `dist.version`, from the metadata's headers alone: each of those parses the whole
    file, long description included, and the two of them took most of a capture's CPU (two parses per distribution)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    headers = email.parser.HeaderParser().parsestr(text.split("\n\n", 1)[0])
    return headers["Name"], headers["Version"]


def _editable_source(dist: importlib.metadata.Distribution) -> str | None:
    try:
        direct = dist.read_text("direct_url.json")
    except OSError:
        return None
    if not direct:
        return None
    info = json.loads(direct)
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = info.get("url", "")
    return url.removeprefix("file://")


def _git_sections(r: Redactor, code_paths: tuple[Path, ...], timeout: float) -> str:
    legato_root = Path(__file__).resolve().parent.parent
    roots: dict[str, Path] = {}
    for label, path in [*(("user code", p) for p in code_paths), ("legato", legato_root)]:
        top = _command(["git", "-C", str(path), "rev-parse", "--show-toplevel"], timeout).get("output")
        if top and top.strip() not in roots.values():
            roots[label] = Path(top.strip())
    return "".join(_git_state(label, root, r, timeout) for label, root in roots.items()) or "no git checkout found\n"


def _git_state(label: str, path: Path, r: Redactor, timeout: float) -> str:
    def git(*args: str) -> str:
        return (_command(["git", "-C", str(path), *args], timeout).get("output") or "").strip()

    commit = git("rev-parse", "HEAD") or "(not a git checkout)"
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    diff = git("diff", "HEAD")
    untracked = git("ls-files", "--others", "--exclude-standard")
    parts = [f"## {label}: {path}", f"commit {commit}", f"branch {branch}"]
    if untracked:
        parts.append("untracked:\n" + untracked)
    parts.append("diff:\n" + (r.text(diff) if diff else "(clean)"))
    return "\n".join(parts) + "\n\n"


def stack_text() -> str:
    """The Python/torch/CUDA/cuDNN/NCCL stack section (imports torch when this process has not)."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }
    try:
        import torch
    except ImportError:
        return json.dumps(info, indent=2) + "\n"
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return json.dumps(info, indent=2) + "\n\ntorch.__config__.show():\n" + torch.__config__.show()


def _host(r: Redactor, threads: str | None = None) -> str:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines() if line.startswith("model name")),
        platform.processor(),
    )
    memory = next((line.split(":", 1)[1].strip() for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), "?")
    lines = [
        f"hostname {socket.gethostname()}",
        f"platform {platform.platform()}",
        f"cpu {cpu}",
        f"cpus {os.cpu_count()}",
        f"memory {memory}",
    ]
    if threads is not None:
        lines.append(f"torch threads per rank {threads}")
    lines += [
        f"{k}={v}" for k, v in r.environ({k: v for k, v in os.environ.items() if k.startswith("SLURM_")}).items() if not is_fingerprint(v)
    ]
    return "\n".join(lines) + "\n"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# -- external commands ---------------------------------------------------------------


def _external_commands() -> dict[str, list[str]]:
    cmds: dict[str, list[str]] = {}
    if shutil.which("nvidia-smi"):
        cmds["gpu"] = ["nvidia-smi", "-q"]
    modules = _modules_command()
    if modules:
        cmds["modules"] = modules
    if shutil.which("dpkg-query"):
        cmds["os_packages"] = ["dpkg-query", "-W", "-f", "${Package}=${Version}\n"]
    elif shutil.which("rpm"):
        cmds["os_packages"] = ["rpm", "-qa", "--qf", "%{NAME}=%{VERSION}-%{RELEASE}\n"]
    return cmds


def _modules_command() -> list[str] | None:
    """`module list` where Lmod or Environment Modules are set up (it is a shell function, so through bash)."""
    lmod = os.environ.get("LMOD_CMD")
    if lmod:
        return [lmod, "bash", "list"]
    home = os.environ.get("MODULESHOME")
    if home and Path(home, "init", "bash").is_file():
        return ["bash", "-c", 'source "$MODULESHOME/init/bash" && module list 2>&1']
    return None


def _command(cmd: list[str], timeout: float) -> dict:
    """One external command's outcome as plain data for the manifest (its output under "output")."""
    return dataclasses.asdict(run_command(cmd, timeout))
