"""Built-in tasks: small models with data made on the spot, for demos, tests and benchmarks.

A task builds a model, a dataset and a loss from plain options; it never
touches the network, the filesystem or the global RNGs outside model init.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the option schema (legato.tasks.options) is read by the config without torch
    import torch


@dataclass
class Task:
    """A built-in training task: the model, its dataset, and the loss of the model on a batch."""

    model: torch.nn.Module
    dataset: torch.utils.data.Dataset
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]


def build_task(name: str, options: dict, seed: int) -> Task:
    """The built-in task `name` ("tiny_gpt" or "mlp") built from its options; a ValueError for any other name."""
    if name == "tiny_gpt":
        from legato.tasks.tiny_gpt import build
    elif name == "mlp":
        from legato.tasks.mlp import build
    else:
        raise ValueError(f"unknown task {name!r}")
    return build(options, seed)
