"""The backends by executor name: the one place that turns the config's `executor` into a `Backend`.

It must NEVER hold logic of its own: every difference between schedulers is a
method or attribute of `legato.slurm.backend.Backend`.
"""

from __future__ import annotations

from legato.errors import UsageError
from legato.slurm.backend import Backend
from legato.slurm.cluster import SlurmBackend
from legato.slurm.local import LocalBackend

BACKENDS: dict[str, type[Backend]] = {"local": LocalBackend, "slurm": SlurmBackend}


def backend_for(executor_name: str) -> Backend:
    """The backend that runs jobs of `executor_name` (a config's `executor`, or submitit's `JobEnvironment().cluster`)."""
    try:
        return BACKENDS[executor_name]()
    except KeyError:
        raise UsageError(
            f"executor is {executor_name!r}; legato runs jobs with {' or '.join(BACKENDS)} only. Set executor to one of them."
        ) from None
