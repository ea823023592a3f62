"""A checkpoint's files verified by every rank together, each hashing its share of the bytes.

Choosing the checkpoint to resume is rank 0's (legato.store.resumable.newest_usable);
verifying its files (a hash pass over every byte: after the resume loaded them,
or each candidate's before, where that failed) is the longest part of it. Here
rank 0's verifier hands each request to the other ranks, which wait in `serve`
while rank 0 works (`led` runs both sides): every rank hashes the files `assign`
gives it (the biggest first, each to the rank with the fewest bytes so far),
and the first problem in rank order is raised on rank 0 as its own verifier
would raise it. Rank 0 ends the service with `done`, whatever its work came
to. This module must never decide which checkpoint is chosen, and never read
anything but the files it is asked to verify.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from legato.dist.peers import Peers
from legato.store.manifest import Verifier, verify_listed

T = TypeVar("T")


def assign(files: dict, world_size: int) -> list[dict]:
    """The files (name -> {bytes, hash, segments}) each rank verifies, balanced by bytes; the same on every rank."""
    shares: list[dict] = [{} for _ in range(world_size)]
    loads = [0] * world_size
    for name in sorted(files, key=lambda n: (-int(files[n]["bytes"]), n)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank][name] = files[name]
        loads[rank] += int(files[name]["bytes"])
    return shares


class VerifiedTogether:
    """One rank's side of verifying files together: rank 0 calls `verify` (a manifest `Verifier`) and `done`; the others `serve`."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    def verify(self, directory: Path, files: dict) -> None:
        """Rank 0: verify `files` in `directory` with every rank; raises the first rank's problem (ValueError naming the file)."""
        mine = assign(files, self.peers.world_size)[0]  # malformed sizes are rank 0's error, raised before any rank is asked
        self.peers.from_leader((str(directory), files))
        self._check(directory, mine)

    def led(self, work: Callable[[Verifier], T]) -> T | None:
        """Collective: rank 0 runs `work` with `verify` as its verifier while the other ranks serve it; `work`'s result on
        rank 0, None on the others."""
        if self.peers.rank != 0:
            self.serve()
            return None
        try:
            return work(self.verify)
        finally:
            self.done()

    def done(self) -> None:
        """Rank 0: nothing more to verify; the other ranks leave `serve`."""
        self.peers.from_leader(None)

    def serve(self) -> None:
        """Every rank but 0: verify its share of each request until rank 0 is done."""
        while (request := self.peers.from_leader(None)) is not None:
            self._check(Path(request[0]), assign(request[1], self.peers.world_size)[self.peers.rank])

    def _check(self, directory: Path, mine: dict) -> None:
        problem: Exception | None = None
        try:
            verify_listed(directory, mine)
        except Exception as exc:  # rank 0 raises it, where the caller decides what a bad file means
            problem = exc
        found = next((p for p in self.peers.gather(problem) if p is not None), None)
        if found is not None and self.peers.rank == 0:
            raise found
