"""Both SLURM dev clusters' Debian packages, installed before either cluster starts.

The one-node cluster (`legato devcluster up`) needs slurmdbd and MariaDB, the multi-node one (`--nodes`) does not, and
the suite brings both up at once on two workers. Each installing its own set would let the one-node cluster's apt-get
run while a multi-node job trains: its resume then finds the machine's package list changed between two attempts, as
a real administrator's upgrade would, and the environment check says so. One install of the union, under the install
lock the clusters share, happens before any job of either starts.
"""

from __future__ import annotations

from legato.errors import UsageError
from legato.slurm import devcluster, multinode


def install_both_clusters_packages() -> str | None:
    """Install every package either dev cluster needs (nothing when all their binaries are on PATH already); why it
    could not, or None."""
    packages = tuple(dict.fromkeys(devcluster.PACKAGES + multinode.PACKAGES))
    binaries = tuple(dict.fromkeys(devcluster.BINARIES + multinode.BINARIES))
    try:
        devcluster.install_packages(lambda line: None, packages, binaries)
    except UsageError as exc:
        return f"installing SLURM's packages failed: {exc}"
    return None
