"""The `legato` command line: the only place that formats for people.

    legato run CONFIG [--set key=value ...] [--detach]   submit, stay attached, carry the run to its end
    legato watch RUN_DIR                                 re-attach (and supervise if no one else does)
    legato status [RUN_DIR] [--json]                     attempts, resumes, how each ended
    legato cancel RUN_DIR                                stop the job and end the run
    legato logs RUN_DIR [--rank R] [--job J]             the tasks' output
    legato verify CONFIG [--interrupt-at 7,19 | --interruptions K --seed S]   prove bitwise resume
    legato verify --command "torchrun ... train.py {run_dir}" --interrupt-at 7,19   the same for any script
    legato plot RUN_DIR                                  loss curve PNG with resume points
    legato repro show|diff|capture                       environment captures per job and attempt
    legato devcluster up|down|status [--nodes N]         a real SLURM on this machine: one node, or N network-namespace nodes
    legato train CONFIG [--nproc N]                      no scheduler: rerun the trainer until done

    legato --version                                     legato <version>

Exit codes: 0 training complete with every resume verified, 1 the run failed
or was cancelled (the reason is in `legato status`), 2 bad input (one
paragraph on stderr naming the flag or key, never the value given; nothing
started or changed), 3 a resume did not verify, 141 stdout's reader went away
(`legato status --json | head -1`): the rest is dropped quietly, and 141 is the
shell's code for a writer ended by SIGPIPE, so `set -o pipefail` sees the cut.

The grammar lives in arguments.py, the subcommands in commands/ (one module
per family: supervising, inspecting, verifying, tooling), the workflows in the
modules that own them (supervisor.py, verify_config.py, control.py...), the
wording in display.py and reports.py; this module parses, picks the command
(importing its family alone) and turns what escapes it into an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from legato.errors import EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from legato.orchestrator.arguments import build_parser

EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away

Command = Callable[[argparse.Namespace], int]


# One loader per family: a family is imported only when one of its commands runs, so that `legato status` never loads
# submitit and the supervisor (they were half of each call's 0.55 s of CPU).
def _supervising() -> dict[str, Command]:
    from legato.orchestrator.commands import supervising as family

    return {
        "run": family.cmd_run,
        "watch": family.cmd_watch,
        "train": family.cmd_train,
        "cancel": family.cmd_cancel,
        "requeue": family.cmd_requeue,
    }


def _inspecting() -> dict[str, Command]:
    from legato.orchestrator.commands import inspecting as family

    return {"status": family.cmd_status, "logs": family.cmd_logs, "plot": family.cmd_plot, "repro": family.cmd_repro}


def _verifying() -> dict[str, Command]:
    from legato.orchestrator.commands import verifying as family

    return {"verify": family.cmd_verify}


def _tooling() -> dict[str, Command]:
    from legato.orchestrator.commands import tooling as family

    return {"init": family.cmd_init, "schema": family.cmd_schema, "completion": family.cmd_completion, "devcluster": family.cmd_devcluster}


FAMILIES: dict[str, Callable[[], dict[str, Command]]] = {
    **dict.fromkeys(("run", "watch", "train", "cancel", "requeue"), _supervising),
    **dict.fromkeys(("status", "logs", "plot", "repro"), _inspecting),
    "verify": _verifying,
    **dict.fromkeys(("init", "schema", "completion", "devcluster"), _tooling),
}


def main(argv: list[str] | None = None) -> int:
    """Run one `legato` command; its exit code."""
    try:
        args = build_parser().parse_args(argv)
        code = FAMILIES[args.command]()[args.command](args)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's last flush
        return code
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt:  # any other command: nothing to clean up, no traceback
        print("\nlegato: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the output still buffered for the closed pipe is dropped quietly at exit."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
