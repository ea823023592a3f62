"""`python -m legato.torchrun ARGS`: torchrun, except that ranks stopped at a checkpoint exit 75, not "failed".

torchrun reports any non-zero exit of a worker as a failure: a traceback, a
ChildFailedError summary and exit 1, so a stop at a committed checkpoint
(every rank exits 75, see `Session.exit_code`) cannot be told from a crash.
This runs torchrun itself (same arguments, same agent) and, when a rank
exited 75 and every other failed rank exited 75 too or was ended by the
agent's own SIGTERM (the agent ends the others as soon as one exits; a rank
exits 75 only after the checkpoint is published on every rank), says so in
one line and exits 75; anything else is torchrun's own outcome. It must never change what torchrun does to workers.

One launch per attempt: run the same command again after a 75 (a loop in the
job script, or the scheduler's requeue). `--max-restarts N` instead makes the
agent restart the workers in place after a stop, which resumes them at once.
"""

from __future__ import annotations

import logging
import signal
import sys

from legato.errors import EXIT_OK, EXIT_STOPPED
from legato.voice import say

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as exc:
        codes = {failure.exitcode for failure in exc.failures.values()}
        if EXIT_STOPPED not in codes or not codes <= {EXIT_STOPPED, -signal.SIGTERM}:
            raise
        say(log, 0, "every rank stopped at a committed checkpoint (exit %d); run the same command again to resume", EXIT_STOPPED)
        return EXIT_STOPPED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
