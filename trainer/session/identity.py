"""Who this run and this attempt are: a run id kept across requeues, and the attempt's number, for trackers and the ledger.

The run id is created once, by the first process that needs it, and kept in the
run directory (`RunPaths.run_id`); every later attempt reads it, so a tracker
continues the same run after each requeue (W&B's `id=session.run_id`). It is
published with an exclusive hard link, so ranks or launches that start together
agree on one id without talking. The attempt number counts the `ATTEMPT_STARTED`
records since the newest `legato run` started the directory's current session:
under `legato run` the job side wrote this attempt's record already; a script's
own Session (torchrun, srun, plain python) writes it here, on rank 0, and
tags its ledger records with it. Rank 0 decides and hands the numbers to the
others. It must never decide anything about training, and never rewrite an id
once it exists.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from legato.dist.peers import Peers
from legato.events import SCRIPT_EXECUTOR, Kind
from legato.ledger_file import read_records, record
from legato.paths import RunPaths
from legato.system.processes import launch_times

# The job a script's attempt belongs to in the ledger: SLURM's job id when SLURM launched it, else this.
SCRIPT_JOB = "script"


@dataclass(frozen=True)
class Identity:
    """This run's id, this attempt's number (1 for the first), and the job tag its ledger records carry."""

    run_id: str
    attempt: int
    job_id: str

    @property
    def tag(self) -> dict:
        """The ledger's job tag of this attempt: its job and, as `restart`, the attempts before it."""
        return {"job_id": self.job_id, "restart": self.attempt - 1}

    @classmethod
    def establish(cls, run_dir: Path, peers: Peers, scripted: bool) -> Identity:
        """Collective: read (or create) the run id; a script's Session also records its attempt as started (rank 0)."""
        hosts = peers.gather(socket.gethostname()) if scripted else []
        job_id = os.environ.get("SLURM_JOB_ID") or SCRIPT_JOB
        found = None
        if peers.rank == 0:
            found = (run_id(run_dir), _attempts(run_dir) + scripted)
            if scripted:
                record(
                    run_dir,
                    Kind.ATTEMPT_STARTED,
                    job_id=job_id,
                    restart=found[1] - 1,
                    executor=SCRIPT_EXECUTOR,
                    hosts=list(dict.fromkeys(hosts)),
                    world_size=peers.world_size,
                    master_addr=os.environ.get("MASTER_ADDR", ""),
                    **launch_times(os.environ),
                )
        rid, attempt = peers.from_leader(found)
        return cls(rid, max(1, attempt), job_id)


def run_id(run_dir: str | Path) -> str:
    """The run's id: read from the run directory, or created there by whichever process comes first."""
    path = RunPaths(run_dir).run_id
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        draft.write_text(secrets.token_hex(8) + "\n")
        try:
            os.link(draft, path)  # fails if another process published first; its id stands
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


def _attempts(run_dir: Path) -> int:
    """`ATTEMPT_STARTED` records since the newest `RUN_STARTED` (all of them when no `legato run` started the directory)."""
    count = 0
    for event in read_records(run_dir):
        if event["event"] == Kind.RUN_STARTED:
            count = 0
        count += event["event"] == Kind.ATTEMPT_STARTED
    return count
