"""The `legato` command line: the only place that formats for people.

    legato train CONFIG [--nproc N] [--set key=value ...]

runs the trainer on this machine and, each time it stops at a committed
checkpoint (exit 75), starts it again to resume, until training completes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from orchestrator.runstate import final_manifest
from trainer.config import load_config
from trainer.errors import EXIT_OK, EXIT_STOPPED, EXIT_USAGE, UsageError

MAX_LOCAL_ATTEMPTS = 100


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="legato", description="Exact-resume supervisor for PyTorch DDP jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run the trainer locally, resuming after every stop until done")
    train.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    train.add_argument("--nproc", type=int, default=None, help="ranks (default: local.tasks)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--fresh", action="store_true", help="refuse to start if the run directory already has checkpoints")
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    run_dir = cfg.run_dir
    if args.fresh and final_manifest(run_dir) is not None:
        raise UsageError(f"--fresh: {run_dir} already holds checkpoints. Remove it, or drop --fresh to resume it.")
    cmd = [sys.executable, "-m", "trainer", str(args.config)]
    if args.nproc is not None:
        cmd += ["--nproc", str(args.nproc)]
    for item in args.overrides:
        cmd += ["--set", item]
    for attempt in range(1, MAX_LOCAL_ATTEMPTS + 1):
        print(f"legato: attempt {attempt}: {' '.join(cmd[1:])}", flush=True)
        code = subprocess.call(cmd)
        manifest = final_manifest(run_dir)
        where = f"step {manifest['step']} (global hash {manifest['global_hash']})" if manifest else "no checkpoint"
        if code == EXIT_STOPPED:
            print(f"legato: attempt {attempt} stopped at a committed checkpoint, {where}; resuming", flush=True)
            continue
        if code == EXIT_OK:
            print(f"legato: training complete after {attempt} attempt(s): {where}", flush=True)
        else:
            print(f"legato: attempt {attempt} failed with exit code {code}; last checkpoint: {where}", file=sys.stderr)
        return code
    print(f"legato: gave up after {MAX_LOCAL_ATTEMPTS} attempts", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"train": cmd_train}[args.command](args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
