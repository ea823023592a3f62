"""Capture and restore every random number generator a rank depends on.

Each RNG is a torch `Stateful` (see `components`), so the Session's component
table saves, restores and hashes them like any other state. The captured
state is plain data only (tensors and ints), so it round-trips through
`torch.load(weights_only=True)`. Capturing never draws from any
generator. Restoring is loud: a state that does not fit (another torch
version, another number of CUDA devices) raises, it is never skipped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import cast

import numpy as np
import torch

from legato.errors import UsageError

PYTHON = "rng.python"
NUMPY = "rng.numpy"
TORCH = "rng.torch"
CUDA = "rng.cuda"
GENERATOR_PREFIX = "rng.gen."


class _Global:
    """One process-wide RNG as a torch `Stateful`; `draw` consumes one number (fault injection only)."""

    def __init__(self, capture: Callable[[], dict], restore: Callable[[dict], None], draw: Callable[[], object]) -> None:
        self._capture, self._restore, self._draw = capture, restore, draw

    def state_dict(self) -> dict:
        return self._capture()

    def load_state_dict(self, state: dict) -> None:
        self._restore(state)

    def draw(self) -> None:
        self._draw()


class GeneratorState:
    """A `torch.Generator` as a torch `Stateful`."""

    def __init__(self, name: str, generator: torch.Generator) -> None:
        self.name, self.generator = name, generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        _check_size(f"generator {self.name}", state["state"], self.generator.get_state())
        self.generator.set_state(state["state"])

    def draw(self) -> None:
        torch.rand(1, generator=self.generator)


def components(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, _Global | GeneratorState]:
    """Every RNG of this process as a Stateful, keyed by component name (CUDA only where it is available)."""
    found: dict[str, _Global | GeneratorState] = {
        PYTHON: _Global(_capture_python, _restore_python, random.random),
        NUMPY: _Global(_capture_numpy, _restore_numpy, np.random.rand),
        TORCH: _Global(lambda: {"state": torch.get_rng_state()}, _restore_torch, lambda: torch.rand(1)),
    }
    if torch.cuda.is_available():
        found[CUDA] = _Global(lambda: {"states": list(torch.cuda.get_rng_state_all())}, _restore_cuda, lambda: torch.rand(1, device="cuda"))
    for name, gen in (generators or {}).items():
        found[GENERATOR_PREFIX + name] = GeneratorState(name, gen)
    return found


def capture(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, dict]:
    """Return the state of every RNG of this process, keyed by component name."""
    return {name: rng.state_dict() for name, rng in components(generators).items()}


def restore(state: Mapping[str, dict], generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Set every RNG back to `state`; a component missing from `state` is refused."""
    found = components(generators)
    missing = set(found) - set(state)
    if missing:
        raise UsageError(
            f"The checkpoint has no state for {', '.join(sorted(missing))}. It was written by a run with other "
            "generators or devices; resume it with the same setup, or start a new run directory."
        )
    for name in sorted(found):
        found[name].load_state_dict(state[name])


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
    # The global generator is an MT19937, whose legacy state is this tuple (numpy's stubs type the call as a dict).
    kind, keys, pos, has_gauss, cached = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
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


def _check_size(what: str, saved: torch.Tensor, current: torch.Tensor) -> None:
    if saved.numel() != current.numel():
        raise UsageError(
            f"The {what} RNG state in the checkpoint has {saved.numel()} bytes, this torch ({torch.__version__}) uses "
            f"{current.numel()}: the checkpoint comes from another torch version. Resume with the torch version that wrote it."
        )
