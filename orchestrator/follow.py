"""A script's run, followed: a run directory a user's own script wrote (torchrun, srun, plain python), with no supervisor.

Such a run has a ledger and progress (the script's Session writes them,
`legato.recorder`) but no captured config: its own launcher, not `legato run`,
relaunches it after each stop. `legato watch` and `legato logs` read it
through here. Nothing here writes, submits or cancels anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from legato.errors import EXIT_FAILED, EXIT_OK
from legato.events import Kind
from legato.orchestrator.display import LiveView
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.status import RunSummary, current_session, read_progress, session_exit_code, summarize

POLL_S = 1.0


def script_exit_code(session: list[dict]) -> int | None:
    """The script's run's exit code once it ended (finished or failed, or its newest attempt left the loop: EXIT_OK after a
    break, EXIT_FAILED after an exception), else None."""
    code = session_exit_code(session)
    ends = [e for e in session if e["event"] in (Kind.ATTEMPT_STARTED, Kind.LOOP_LEFT)]
    if code is not None or not ends or ends[-1]["event"] != Kind.LOOP_LEFT:
        return code
    return EXIT_FAILED if ends[-1].get("exception") else EXIT_OK


def follow(run_dir: Path, notify: Callable[[str, dict], None], seen: int, poll_s: float = POLL_S) -> int:
    """Report the script's run's events after the first `seen` and its progress until it ends; the run's exit code."""
    while True:
        events = current_session(Ledger(run_dir).read())
        for event in events[seen:]:
            notify("event", event)
        seen = len(events)
        code = script_exit_code(events)
        if code is not None:
            return code
        progress = read_progress(run_dir)
        if progress is not None:
            notify(Kind.PROGRESS, progress)
        time.sleep(poll_s)


def wait_for_start(run_dir: Path, started: Callable[[Path], bool], poll_s: float = POLL_S) -> None:
    """Return once `started(run_dir)`: a job still queued, or a script not yet at its Session, has written nothing yet."""
    while not started(run_dir):
        time.sleep(poll_s)


def watch_script(run_dir: Path, view: LiveView, show: Callable[[RunSummary], None]) -> int:
    """`legato watch` of a script's run: show its summary, follow it until it ends, show the summary again; its exit code."""
    session = current_session(Ledger(run_dir).read())
    view.learn(session)
    show(summarize(run_dir, session, read_progress(run_dir)))
    code = script_exit_code(session)
    if code is not None:
        return code
    code = follow(run_dir, view, len(session))
    show(summarize(run_dir, current_session(Ledger(run_dir).read()), read_progress(run_dir)))
    return code


def show_events(view: LiveView, events: list[dict]) -> int:
    """`legato logs` of a script's run: every event its Session recorded, as lines (its output went to its launcher)."""
    for event in events:
        view("event", event)
    return EXIT_OK
