"""Peak resident memory of this process over a block, from the kernel's own high-water mark (Linux).

The kernel tracks the peak resident set size (`VmHWM` in /proc/self/status) and resets it on request (writing 5 to
/proc/self/clear_refs), so a block's peak is read exactly: no sampling thread competes with what is timed, and no
short peak falls between two samples. For the benchmarks only: this must never be imported by the package.
"""

from __future__ import annotations

import gc
from pathlib import Path


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


class PeakMemory:
    """This process's peak resident memory while the block runs, above where it started (`extra`, bytes)."""

    extra = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size to the current one
        self.start = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.extra = _status_bytes("VmHWM") - self.start
