"""Capture and restore every random number generator a rank depends on.

The captured state is plain data only (tensors and ints), so it round-trips
through `torch.load(weights_only=True)`. Capturing never draws from any
generator. Restoring is loud: a state that does not fit (another torch
version, another number of CUDA devices) raises, it is never skipped.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np
import torch

from legato.errors import UsageError

PYTHON = "rng.python"
NUMPY = "rng.numpy"
TORCH = "rng.torch"
CUDA = "rng.cuda"
GENERATOR_PREFIX = "rng.gen."


def capture(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, dict]:
    """Return the state of every RNG of this process, keyed by component name."""
    generators = generators or {}
    state = {PYTHON: _capture_python(), NUMPY: _capture_numpy(), TORCH: {"state": torch.get_rng_state()}}
    if torch.cuda.is_available():
        state[CUDA] = {"states": list(torch.cuda.get_rng_state_all())}
    for name, gen in generators.items():
        state[GENERATOR_PREFIX + name] = {"state": gen.get_state()}
    return state


def restore(state: Mapping[str, dict], generators: Mapping[str, torch.Generator] | None = None, skip: frozenset[str] = frozenset()) -> None:
    """Set every RNG back to `state`; `skip` names components to leave alone (fault injection only)."""
    generators = generators or {}
    expected = set(capture(generators))
    missing = expected - set(state)
    if missing:
        raise UsageError(
            f"The checkpoint has no state for {', '.join(sorted(missing))}. It was written by a run with other "
            "generators or devices; resume it with the same setup, or start a new run directory."
        )
    restorers = {PYTHON: _restore_python, NUMPY: _restore_numpy, TORCH: _restore_torch, CUDA: _restore_cuda}
    for name in sorted(expected - skip):
        if name.startswith(GENERATOR_PREFIX):
            _restore_generator(name, generators[name[len(GENERATOR_PREFIX):]], state[name])
        else:
            restorers[name](state[name])


def _capture_python() -> dict:
    version, internal, gauss_next = random.getstate()
    return {
        "version": version,
        "internal": torch.tensor(internal, dtype=torch.int64),
        "gauss_next": gauss_next,
    }


def _restore_python(state: dict) -> None:
    internal = tuple(int(x) for x in state["internal"].tolist())
    random.setstate((state["version"], internal, state["gauss_next"]))


def _capture_numpy() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _restore_numpy(state: dict) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["kind"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"]))


def _restore_torch(state: dict) -> None:
    _check_size("torch CPU", state["state"], torch.get_rng_state())
    torch.set_rng_state(state["state"])


def _restore_cuda(state: dict) -> None:
    current = torch.cuda.get_rng_state_all()
    saved = state["states"]
    if len(saved) != len(current):
        raise UsageError(
            f"The checkpoint holds CUDA RNG state for {len(saved)} devices, this rank sees {len(current)}. "
            "Resume with the same CUDA_VISIBLE_DEVICES and GPUs per task."
        )
    for i, (s, c) in enumerate(zip(saved, current)):
        _check_size(f"CUDA device {i}", s, c)
    torch.cuda.set_rng_state_all(saved)


def _restore_generator(name: str, gen: torch.Generator, state: dict) -> None:
    _check_size(f"generator {name}", state["state"], gen.get_state())
    gen.set_state(state["state"])


def _check_size(what: str, saved: torch.Tensor, current: torch.Tensor) -> None:
    if saved.numel() != current.numel():
        raise UsageError(
            f"The {what} RNG state in the checkpoint has {saved.numel()} bytes, this torch ({torch.__version__}) uses "
            f"{current.numel()}: the checkpoint comes from another torch version. Resume with the torch version that wrote it."
        )
