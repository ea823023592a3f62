"""The `legato` command-line grammar: every subcommand, flag and default, `--version`, and usage errors.

A usage error names the flag (or the --set key) that is wrong and never echoes
the value given (`legato.quiet_args.Parser`).

This module must never import torch or anything that does: `legato --help`
and `legato --version` stay instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import re
from pathlib import Path

from legato.config import SlurmSection
from legato.orchestrator.completion import SHELLS
from legato.quiet_args import Parser
from legato.slurm.slurmconf import Settings

MULTINODE_ANY = -1  # `--nodes` without a number: whichever multi-node cluster is up
# `legato requeue --max-requeues`: a job script's budget defaults to a config's `slurm.max_requeues`.
REQUEUE_BUDGET = next(f.default for f in dataclasses.fields(SlurmSection) if f.name == "max_requeues")


def version() -> str:
    """legato's version from the installed package's metadata, or from pyproject.toml beside a source checkout."""
    try:
        return importlib.metadata.version("legato")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
    return found.group(1) if found else "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every `legato` command."""
    parser = Parser(prog="legato", description="Exact-resume supervisor for PyTorch DDP jobs.")
    parser.add_argument("--version", action="version", version=f"legato {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="submit a config and carry it across every stop until training completes")
    run.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (YAML typing)"
    )
    run.add_argument("--detach", action="store_true", help="return once the job is submitted; `legato watch RUN_DIR` re-attaches")

    watch = sub.add_parser("watch", help="follow a run (and supervise it when no supervisor is attached)")
    watch.add_argument("run_dir")

    status = sub.add_parser("status", help="attempts, resumes and the state of a run")
    status.add_argument("run_dir", nargs="?", help="run directory (default: the newest under runs/)")
    status.add_argument("--json", action="store_true", help="print the same as JSON")

    cancel = sub.add_parser("cancel", help="cancel the run's job and end the run")
    cancel.add_argument("run_dir")

    logs = sub.add_parser("logs", help="print the output of the run's tasks")
    logs.add_argument("run_dir")
    logs.add_argument("--rank", type=int, default=0, help="task rank (default 0)")
    logs.add_argument("--job", default=None, help="job id (default: every job of the run)")

    verify = sub.add_parser("verify", help="prove that a config resumes bit for bit against an uninterrupted run")
    verify.add_argument("config", nargs="?", help="YAML config (omit with --compare)")
    where = verify.add_mutually_exclusive_group()
    where.add_argument("--interrupt-at", metavar="STEPS", help="comma-separated steps after which one rank gets the stop signal, e.g. 7,19")
    where.add_argument("--interruptions", type=int, metavar="K", help="K interruptions at random steps (with --seed)")
    where.add_argument("--compare", nargs=2, metavar=("REFERENCE", "RUN"), help="only compare two finished run directories")
    verify.add_argument("--seed", type=int, default=0, help="seed for the random interruption steps (default 0)")
    verify.add_argument("--executor", choices=("local", "slurm"), help="override the config's executor")
    verify.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    verify.add_argument("--out", metavar="DIR", help="where the runs go (default runs/verify/<name>-<time>)")
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verify.add_argument(
        "--reference",
        metavar="DIR",
        help="compare against the finished reference/ of an earlier verify of this config instead of training it again",
    )
    verify.add_argument(
        "--command",
        dest="run_command",
        metavar="CMD",
        help="verify this command instead of a config; {run_dir} stands for its run directory",
    )
    verify.add_argument("--signal-rank", type=int, default=0, help="with --command: the rank that gets the stop signal (default 0)")

    plot = sub.add_parser("plot", help="PNG of a run's loss curve with its resume points")
    plot.add_argument("run_dir")
    plot.add_argument("--reference", metavar="RUN_DIR", help="overlay this run (e.g. an uninterrupted one)")
    plot.add_argument("--out", metavar="PNG", help="default RUN_DIR/loss.png")

    repro = sub.add_parser("repro", help="environment captures: show one, diff two, capture now")
    rsub = repro.add_subparsers(dest="repro_command", required=True)
    show = rsub.add_parser("show", help="print a capture")
    show.add_argument("capture", help="a capture directory, or JOB[/ATTEMPT] with --run")
    show.add_argument("--run", metavar="RUN_DIR", help="run directory to look JOB[/ATTEMPT] up in")
    show.add_argument("--section", action="append", default=[], help="only these sections (env, packages, git, stack, ...)")
    rdiff = rsub.add_parser("diff", help="what differs between two captures; exit 1 when anything does")
    rdiff.add_argument("a", help="a capture directory, or JOB[/ATTEMPT] with --run")
    rdiff.add_argument("b")
    rdiff.add_argument("--run", metavar="RUN_DIR", help="run directory to look JOB[/ATTEMPT] up in")
    rcap = rsub.add_parser("capture", help="capture the current environment into DIR (for any script)")
    rcap.add_argument("dir")
    rcap.add_argument("--code", action="append", default=[], metavar="PATH", help="your code's directory, for its git state (default: .)")
    rcap.add_argument("--timeout", type=float, default=5.0, metavar="S", help="limit per external command (default %(default)s)")

    dev = sub.add_parser(
        "devcluster", help="a real SLURM cluster on this machine: one node, or N nodes in network namespaces (root, Debian)"
    )
    dev.add_argument("action", choices=("up", "down", "status"))
    dev.add_argument(
        "--nodes",
        type=int,
        nargs="?",
        const=MULTINODE_ANY,
        default=None,
        metavar="N",
        help="the multi-node cluster: N slurmd nodes, each its own network namespace, hostname and munge (with down/status: N may be "
        "omitted)",
    )
    # The cluster's timings, in seconds (legato.slurm.slurmconf.Settings holds each default).
    for flag, default, what in (
        ("--cred-expire", Settings.cred_expire_s, "credential expiry; a requeued job waits S+1 s"),
        ("--sched-interval", Settings.sched_interval_s, "scheduler and backfill interval"),
        ("--kill-wait", Settings.kill_wait_s, "SIGTERM to SIGKILL delay"),
        (
            "--preempt-grace",
            Settings.preempt_grace_s,
            "how long a job preempted by one in the `urgent` partition has between its SIGTERM and its requeue",
        ),
    ):
        dev.add_argument(flag, type=int, default=default, metavar="S", help=f"{what} (default %(default)s)")
    dev.add_argument("--no-accounting", action="store_true", help="no slurmdbd/MariaDB: sacct will not work")

    train = sub.add_parser("train", help="run the trainer locally without a scheduler, resuming after every stop until done")
    train.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    train.add_argument("--nproc", type=int, default=None, help="ranks (default: local.tasks)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--fresh", action="store_true", help="refuse to start if the run directory already has checkpoints")

    requeue = sub.add_parser(
        "requeue", help="in a job script after the launcher: requeue the job on exit 75 or 124, within a budget and only after progress"
    )
    requeue.add_argument("run_dir", help="the run directory the training script was given")
    requeue.add_argument("--exit-code", type=int, required=True, metavar="N", help="the launcher's exit code: --exit-code $?")
    requeue.add_argument(
        "--max-requeues", type=int, default=REQUEUE_BUDGET, metavar="N", help="requeues allowed per job (default %(default)s)"
    )

    init = sub.add_parser("init", help="write a training script ported to legato, its job script and a config into a folder")
    init.add_argument("folder", help="where to write train.py, job.sbatch and config.yaml (made if missing; nothing is overwritten)")
    init.add_argument("--name", default="exp1", help="the run's name: runs/NAME and the job's name (default %(default)s)")
    init.add_argument("--nproc", type=int, default=2, help="ranks per node (default %(default)s)")
    init.add_argument("--steps", type=int, default=200, help="training steps (default %(default)s)")
    init.add_argument("--time-min", type=int, default=60, help="the job's time limit in minutes (default %(default)s)")

    sub.add_parser("schema", help="print the JSON Schema of a config file, for editors that complete and check its keys")
    completion = sub.add_parser("completion", help='print a shell completion script: eval "$(legato completion bash)"')
    completion.add_argument("shell", choices=SHELLS)
    return parser
