"""A submitted job seen from outside, by its id: is it still alive, signal it, cancel it.

Works for a job this process did not submit (a re-attached supervisor, `legato
cancel`), through the run's `Backend`. A state the scheduler cannot tell
(UNKNOWN) is eventually reported as ended: a handle must NEVER wait on a job
forever.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from legato.slurm.backend import Backend, JobState

UNKNOWN_GRACE_S = 120.0


@dataclass
class JobHandle:
    """One job of `backend`, by its id; remembers how long its state has been unknown."""

    backend: Backend
    job_id: str
    unknown_grace_s: float = UNKNOWN_GRACE_S
    _unknown_since: float | None = field(default=None, repr=False)

    def state(self) -> JobState:
        """The backend's state of the job; UNKNOWN counts as active for `unknown_grace_s`, then as ended."""
        state = self.backend.state(self.job_id)
        if state.name != "UNKNOWN":
            self._unknown_since = None
            return state
        self._unknown_since = self._unknown_since or time.monotonic()
        return JobState("UNKNOWN", time.monotonic() - self._unknown_since < self.unknown_grace_s)

    def signal_tasks(self, sig: signal.Signals, pids: list[int]) -> None:
        """Deliver `sig` to every task of the job (`pids`: the tasks' pids, for a backend that signals by pid)."""
        self.backend.signal(self.job_id, sig, pids)

    def cancel(self) -> None:
        """End the job."""
        self.backend.cancel(self.job_id)
