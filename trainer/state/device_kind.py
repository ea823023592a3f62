"""The kind of device a rank computes on, as a checkpoint records it and a resume compares it: a GPU's model and compute
capability ("NVIDIA H100 80GB HBM3 (sm_90)"), or None for the CPU (whose kernels' instruction set is recorded apart,
`torch.backends.cpu.get_cpu_capability()`).

Kernels differ between GPU models, and between a GPU and the CPU: a run requeued onto another kind would continue on
another trajectory, so legato.store.manifest refuses or names it. This module must never initialise CUDA for a model
whose parameters are on the CPU, nor move anything.
"""

from __future__ import annotations

import torch


def gpu_kind(model: torch.nn.Module) -> str | None:
    """The model and compute capability of the CUDA device `model`'s parameters live on; None when they are not on one."""
    device = next((p.device for p in model.parameters() if p.device.type == "cuda"), None)
    if device is None:
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"
