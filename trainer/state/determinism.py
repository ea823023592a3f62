"""Seeding and determinism switches for one rank.

One run seed fans out to a per-rank seed, derived from (seed, rank) by a hash
so ranks never share a stream. Strict mode turns on every switch PyTorch has
for run-to-run determinism; fast mode leaves the kernels alone but still
records every seed so the run can be replayed. This module must never read or
write checkpoint files.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from legato.config_build import whole_number
from legato.errors import UsageError
from legato.system.launch_env import CUBLAS_WORKSPACE
from legato.voice import refusing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seeds:
    """Every seed a rank was started with: enough to replay it."""

    run_seed: int
    rank: int
    rank_seed: int
    mode: str
    pythonhashseed: str | None


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that is a pure function of `parts` (never of process state)."""
    text = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


@refusing
def seed_everything(seed: int, rank: int = 0, mode: str = "strict") -> Seeds:
    """Seed python, numpy, torch CPU and every CUDA device for this rank.

    In strict mode also enables deterministic algorithms and requires that
    PYTHONHASHSEED was set before the interpreter started (it cannot be set
    afterwards).
    """
    if mode not in ("strict", "fast"):
        raise UsageError(f'seed_everything(mode={mode!r}): mode is "strict" or "fast".')
    if whole_number(seed) is None or whole_number(rank) is None or rank < 0:
        raise UsageError(
            f"seed_everything(seed={seed!r}, rank={rank!r}): the seed is a whole number (seed=1.0 and seed=1 would "
            'seed different streams), and the rank is this process\'s index from 0, such as int(os.environ["RANK"]).'
        )
    hashseed = os.environ.get("PYTHONHASHSEED")
    if mode == "strict":
        _enable_strict(hashseed)
    rank_seed = derive_seed("rank", seed, rank)
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)  # seeds every CUDA device too
    seeds = Seeds(run_seed=seed, rank=rank, rank_seed=rank_seed, mode=mode, pythonhashseed=hashseed)
    log.info("seeded rank %d: run seed %d, rank seed %d, mode %s, PYTHONHASHSEED=%s", rank, seed, rank_seed, mode, hashseed)
    return seeds


def _enable_strict(hashseed: str | None) -> None:
    if hashseed is None or hashseed == "random":
        # Named as the API's argument: legato's own launchers set PYTHONHASHSEED, so only a script's own call gets here.
        raise UsageError(
            'seed_everything(mode="strict") needs PYTHONHASHSEED set before Python starts (set order and str hashes depend on it). '
            "Launch with python -m legato.torchrun, python -m legato or legato run (they set it), or export PYTHONHASHSEED=0 before "
            'plain torchrun or srun, or call seed_everything(seed, rank, mode="fast").'
        )
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            raise UsageError(
                "Strict determinism needs CUBLAS_WORKSPACE_CONFIG set before CUDA starts, but CUDA was already initialised. "
                f"Export CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE} before launching, or call seed_everything before touching CUDA."
            )
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
