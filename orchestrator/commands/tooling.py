"""The subcommands around a run: `legato init` (a ported script, job script and config), `schema`, `completion` and
`devcluster` (a real SLURM on this machine).

Each `cmd_*` takes the parsed arguments and returns the exit code; what they write comes from starter.py,
legato.config_schema, completion.py and legato.slurm's devcluster and multinode.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from legato.config_schema import json_schema
from legato.errors import EXIT_FAILED, EXIT_OK, UsageError
from legato.orchestrator import completion, starter
from legato.orchestrator.arguments import MULTINODE_ANY, build_parser
from legato.slurm import devcluster, multinode
from legato.slurm.devcluster import Settings


def cmd_init(args: argparse.Namespace) -> int:
    """`legato init FOLDER`: a ported training script, its job script and a config (legato.orchestrator.starter)."""
    folder = Path(args.folder)
    written = starter.write(folder, starter.Starter(args.name, args.nproc, args.steps, args.time_min))
    print("\n".join(f"legato init: wrote {path}" for path in written))
    print(
        f"Next: cd {folder} && python -m legato.torchrun --nproc-per-node {args.nproc} train.py runs/{args.name}   "
        "(or: sbatch job.sbatch; or: PYTHONPATH=. legato run config.yaml). Replace build() and fit() in train.py with yours."
    )
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    """`legato schema`: the config's JSON Schema on stdout (legato.config_schema)."""
    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    """`legato completion SHELL`: the completion script for bash or zsh (legato.orchestrator.completion)."""
    print(completion.script(build_parser(), args.shell), end="")
    return EXIT_OK


def cmd_devcluster(args: argparse.Namespace) -> int:
    """`legato devcluster`: bring the local SLURM cluster (one node, or `--nodes N`) up or down, or report its state."""
    say = lambda text: print(f"devcluster: {text}", flush=True)  # noqa: E731
    if args.nodes is not None:
        return _multinode(args, say)
    if args.action == "down":
        devcluster.down(say)
        return EXIT_OK
    if args.action == "up":
        devcluster.up(_settings(args, accounting=not args.no_accounting), say)
    daemons, info = devcluster.status()
    for d in daemons:
        say(f"{d.name:<10} pid {d.pid:<8} {'running' if d.alive() else 'NOT running'}  (log {d.log})")
    say(f"node: {info}" if info else "the controller does not answer")
    return EXIT_OK if info else EXIT_FAILED


def _settings(args: argparse.Namespace, accounting: bool) -> Settings:
    return Settings(
        cred_expire_s=args.cred_expire,
        sched_interval_s=args.sched_interval,
        kill_wait_s=args.kill_wait,
        preempt_grace_s=args.preempt_grace,
        accounting=accounting,
    )


def _multinode(args: argparse.Namespace, say) -> int:
    if args.action == "down":
        multinode.down(say)
        return EXIT_OK
    if args.action == "up":
        if args.nodes == MULTINODE_ANY:
            raise UsageError("legato devcluster up --nodes needs a node count, for example --nodes 2.")
        if not args.no_accounting:
            say("the multi-node cluster runs without accounting (no sacct); legato reads job states from scontrol")
        multinode.up(args.nodes, _settings(args, accounting=False), say)
    daemons, info = multinode.status()
    for d in daemons:
        say(f"{d.name:<18} pid {d.pid:<8} {'running' if d.alive() else 'NOT running'}  (log {d.log})")
    if info:
        say(f"SLURM_CONF={multinode.SLURM_CONF}")
        for line in info.splitlines():
            say(f"node: {line}")
    else:
        say("the controller does not answer")
    return EXIT_OK if info else EXIT_FAILED
