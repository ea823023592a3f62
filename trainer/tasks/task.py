"""What a built-in task is: a model, its dataset and its loss, as the bundled loop (legato.loop) trains them.

It must never import torch at run time: the option schema beside it is read by the config without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class Task:
    """A built-in training task: the model, its dataset, and the loss of the model on a batch."""

    model: torch.nn.Module
    dataset: torch.utils.data.Dataset
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]
