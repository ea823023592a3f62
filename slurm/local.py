"""The local backend: a legato job as submitit's LocalExecutor runs it, its tasks children of one controller process.

The job id is the controller's pid; its state is whether that pid is still
submitit's controller; a requeue is the controller's own restart, asked for
by a task's exit code. The controller's own output goes to
`RUN/submitit/controllers.log` (`RunPaths.controllers_log`), not the terminal it shares with `legato run`
(a Ctrl-C there reaches it too, and its cleanup printed a KeyboardInterrupt
traceback when `cancel` interrupted it again). It must NEVER signal a pid it
did not read from the run's ledger or the job id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from legato.config import Config
from legato.events import Kind
from legato.paths import RunPaths
from legato.slurm import submission
from legato.slurm.backend import Backend, JobPlace, JobState
from legato.system import processes
from legato.system.forking import FORKS

LOCAL_CONTROLLER = b"submitit.local._local"
LOCAL_REQUEUE_EXIT = 144  # submitit's LocalExecutor restarts every task when one exits with it


class LocalBackend(Backend):
    """Jobs on this machine through submitit's LocalExecutor."""

    name = "local"
    state_poll_interval_s = 0.5  # a /proc read
    records_state_changes = False
    signals_task_pids = True
    shares_terminal = True
    tasks_die_with_controller = True  # a task must not train on after its controller was SIGKILLed
    forks_ranks = FORKS  # where ranks fork warm; elsewhere each rank is a task of its own

    def validate(self, cfg: Config) -> None:
        """Every machine with a Python can run a local job: nothing to refuse."""

    def submit(self, cfg: Config, task: Callable[[], Any], exclude: tuple[str, ...] = ()) -> str:
        """Start the job's controller on this machine (`exclude` names no node here and is ignored)."""
        _let_children_take_sigint()
        with _output_to(RunPaths(cfg.run_dir).controllers_log):
            return submission.submit(cfg, submission.local_executor(cfg, submission.job_folder(cfg)), task)

    def identify(self, env: Any, ledger_events: Callable[[], list[dict]]) -> JobPlace:
        """The controller restarts tasks without telling them; the ledger counts its requeues."""
        job_id = str(env.job_id)
        restart = sum(1 for e in ledger_events() if e["event"] == Kind.REQUEUED and e.get("job_id") == job_id)
        return JobPlace(job_id, restart, (socket.gethostname(),))

    def state(self, job_id: str) -> JobState:
        """RUNNING while the controller lives, else ENDED."""
        return JobState("RUNNING", True) if _controller_alive(int(job_id)) else JobState("ENDED", False)

    def signal(self, job_id: str, sig: signal.Signals, pids: list[int]) -> None:
        """Signal each task by its pid."""
        for pid in pids:
            processes.kill(pid, sig)

    def cancel(self, job_id: str) -> None:
        """submitit's controller stops its tasks on SIGINT (SIGINT, then SIGKILL after a second)."""
        processes.kill(int(job_id), signal.SIGINT)

    def requeue(self, job_id: str) -> str | None:
        """Nothing to ask: the task's exit code (`exit_code_after_requeue`) has the controller restart the job."""
        return None

    def exit_code_after_requeue(self, code: int) -> int:
        """submitit's requeue exit code."""
        return LOCAL_REQUEUE_EXIT

    def failed_nodes(self, hosts: list[str]) -> dict[str, str]:
        """This machine is the only node; if it failed, nobody is asking."""
        return {}

    def master_addr(self, hosts: tuple[str, ...]) -> str:
        """Every rank is on this machine."""
        return "127.0.0.1"

    def tasks_per_node(self, cfg: Config) -> int:
        """Every rank is on this machine."""
        return cfg.local.tasks

    def job_environ(self, cfg: Config) -> Mapping[str, str] | None:
        """The local job inherits this process's environment."""
        return None


def _controller_alive(pid: int) -> bool:
    """True while submitit's controller `pid` runs (a zombie or a recycled pid counts as gone)."""
    if not processes.alive(pid):
        return False
    try:
        return LOCAL_CONTROLLER in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _ignore(signum: int, frame: Any) -> None:
    """SIGINT as this process received it before: ignored."""


def _let_children_take_sigint() -> None:
    """`cancel` stops the controller with SIGINT, and an ignored signal stays ignored across exec: started in the
    background by a non-interactive shell (`legato run ... &` in a script), this process ignores SIGINT, and so would
    the controller it starts, which `legato cancel` then could not stop. A handler of our own that ignores it keeps
    this process as it was, and a handled signal is back to its default in an exec'd child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _ignore)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr, as file descriptors, appended to `path` while it starts a child: the child keeps
    them for its life, and this process has its own back on the way out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
