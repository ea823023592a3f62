"""Where a benchmark's ranks compute (`--device cpu|cuda`), for the benchmarks only: the one rule for their backend, and
the refusal of a GPU this machine does not have. On a GPU every rank uses GPU 0: one rank goes over NCCL, several share
the GPU over gloo (NCCL refuses two ranks on one GPU). This must never be imported by the package.
"""

from __future__ import annotations

import sys

import torch


def require(device: str) -> None:
    """Exit 2 with the fix when `device` is cuda and this torch sees no GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "--device cuda puts the benchmark on the GPU, and this torch sees none. Run it on a GPU machine with a CUDA build "
            "of torch, or without --device.",
            file=sys.stderr,
        )
        sys.exit(2)


def backend(device: str, world: int) -> str:
    """NCCL for one rank on a GPU; gloo on the CPU and for ranks that share the one GPU."""
    return "nccl" if device == "cuda" and world == 1 else "gloo"


def describe(device: str, world: int) -> str:
    """The ranks as a benchmark's header names them: "2 ranks gloo", "1 ranks nccl, on NVIDIA H200"."""
    where = f", on {torch.cuda.get_device_name(0)}" if device == "cuda" else ""
    return f"{world} ranks {backend(device, world)}{where}"


def place(device: str) -> torch.device:
    """This rank's device: on a GPU machine, GPU 0 made current (every rank shares it)."""
    if device == "cuda":
        torch.cuda.set_device(0)
    return torch.device(device)
