"""One rank verifying a checkpoint's files together with the others (launch one process per rank, gloo).

    python tests/helpers/verify_together.py DIR OUT

DIR holds `good/` and `bad/`, the same files written by legato, each listed in `files.json` (name -> {bytes, hash,
segments}); one file of `bad/` is altered. Rank 0 verifies `good/` and then `bad/` through
legato.session.file_checks.VerifiedTogether while the other ranks serve, and writes to OUT what each came to: "ok", or
the problem's type and message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from legato.dist.peers import Peers
from legato.session.file_checks import VerifiedTogether


def main(directory: Path, out: Path) -> int:
    dist.init_process_group("gloo")
    peers = Peers.join()
    together = VerifiedTogether(peers)
    if peers.rank != 0:
        together.serve()
        peers.close()
        return 0
    files = json.loads((directory / "files.json").read_text())
    verdicts = {}
    try:
        for name in ("good", "bad"):
            try:
                together.verify(directory / name, files)
                verdicts[name] = "ok"
            except ValueError as exc:
                verdicts[name] = f"{type(exc).__name__}: {exc}"
    finally:
        together.done()
    out.write_text(json.dumps(verdicts))
    peers.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
