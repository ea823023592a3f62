"""Which device a rank trains on, which backend its process group uses, and which AMP dtype it casts to.

One rule, read from the config's `train.device`, `train.backend` and
`train.amp_dtype`: `auto` picks CUDA when the machine has it, NCCL when every
local rank has a GPU of its own, and gloo otherwise: NCCL refuses two ranks on
one GPU, while gloo moves CUDA tensors through host memory and works there.
An explicit choice the machine cannot honour is refused before training with
the fix named. This module must never touch a process group, a checkpoint or
an RNG: it only decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from legato.config import TrainSection
from legato.errors import UsageError


@dataclass(frozen=True)
class Placement:
    """Where one rank trains: its device, its process group's backend and its autocast dtype."""

    device: torch.device
    backend: str
    amp_dtype: torch.dtype

    def describe(self) -> str:
        return f"{self.device} ({self.backend}, amp {str(self.amp_dtype).removeprefix('torch.')})"


def resolve_placement(train: TrainSection, local_rank: int, local_world_size: int) -> Placement:
    """The placement of the rank with `local_rank` among `local_world_size` ranks on this machine."""
    device = _device(train.device, local_rank)
    return Placement(device, _backend(train.backend, device, local_world_size), _amp_dtype(train.amp_dtype, device))


def _device(choice: str, local_rank: int) -> torch.device:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "cpu" or (choice == "auto" and gpus == 0):
        return torch.device("cpu")
    if gpus == 0:
        raise UsageError(
            "train.device is cuda, but this machine has no usable CUDA device (torch.cuda.is_available() is False). "
            "Run on a GPU node with a CUDA build of torch, or set train.device: auto or cpu."
        )
    # Ranks beyond the GPU count share GPUs round-robin; _backend keeps NCCL off shared GPUs.
    return torch.device("cuda", local_rank % gpus)


def _backend(choice: str, device: torch.device, local_world_size: int) -> str:
    if device.type == "cpu":
        if choice == "nccl":
            raise UsageError(
                "train.backend is nccl, but the ranks train on the CPU; NCCL moves CUDA tensors only. Set train.backend: auto or gloo."
            )
        return "gloo"
    shared = local_world_size > torch.cuda.device_count()
    if choice == "nccl" and shared:
        raise UsageError(
            f"train.backend is nccl, but {local_world_size} ranks share {torch.cuda.device_count()} GPU(s) on this machine and NCCL "
            "refuses two ranks on one GPU. Start at most one rank per GPU, or set train.backend: auto or gloo."
        )
    if choice == "auto":
        return "gloo" if shared else "nccl"
    return choice


def _amp_dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[choice]
