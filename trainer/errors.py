"""User-facing errors and the exit codes they map to.

Every problem a user can fix (a bad config, a missing file, a checkpoint that
does not fit this run) is raised as a `UsageError`: one paragraph naming the
problem and the fix. Entry points turn it into exit code 2 with no traceback:
the command line and the launchers catch it; in a user's own script, the public
API says it and raises it on as a `UsageRefused`, which ends an uncaught script
the same way.
This module must never import anything heavy: the CLI imports it first.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_RESUME_MISMATCH = 3
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped at a committed checkpoint, run again to resume
EXIT_HUNG = 124  # as timeout(1): the hang watchdog ended an attempt that made no progress; run again to resume
EXIT_INTERRUPTED = 130  # 128 + SIGINT: a `legato` command stopped by Ctrl-C, after the cleanup it owed


class UsageError(Exception):
    """A problem in the user's input, explained in one paragraph."""

    exit_code = EXIT_USAGE


class UsageRefused(UsageError, SystemExit):
    """A UsageError the public API has already said (legato.voice.refusing).

    Caught like any UsageError; left uncaught in a user's script, it ends the process as `sys.exit(2)` does, with no
    traceback under the paragraph.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = EXIT_USAGE  # what the interpreter exits with when nothing catches it


class ResumeMismatchError(Exception, SystemExit):
    """The restored state does not hash to what the checkpoint recorded (or its replay diverged).

    An Exception to catch like any other; left uncaught in a user's script, it ends the process as `sys.exit(3)`
    does, with no traceback: the Session has said the one paragraph already (legato.voice.refuse).
    """

    exit_code = EXIT_RESUME_MISMATCH

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = EXIT_RESUME_MISMATCH  # what the interpreter exits with when nothing catches it
