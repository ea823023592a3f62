"""A small MLP with dropout, batch norm and mixup regressing a fixed nonlinear function of synthetic inputs.

Each sample is jittered with noise drawn from its own (seed, epoch, index)
generator, so augmentation is exact under resume and any worker count.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from legato.state.sampler import sample_generator
from legato.tasks.task import Task


class Synthetic(torch.utils.data.Dataset):
    """A fixed random regression set; each sample's jitter is drawn from its own generator (seed, epoch, index)."""

    def __init__(self, n: int, features: int, seed: int, jitter: float) -> None:
        gen = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, features, generator=gen)
        w = torch.randn(features, 1, generator=gen)
        self.y = torch.sin(self.x @ w) + 0.1 * torch.randn(n, 1, generator=gen)
        self.seed = seed
        self.jitter = jitter
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.randn(self.x.shape[1], generator=sample_generator(self.seed, self.epoch, index))
        return self.x[index] + self.jitter * noise, self.y[index]


def build(options: dict, seed: int) -> Task:
    """The "mlp" task: a small regression MLP with batch norm and dropout on a synthetic set, with mixup on half the steps."""
    features = int(options.get("features", 16))
    hidden = int(options.get("hidden", 64))
    model = nn.Sequential(
        nn.Linear(features, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Dropout(float(options.get("dropout", 0.1))),
        nn.Linear(hidden, 1),
    )
    dataset = Synthetic(int(options.get("samples", 512)), features, seed, float(options.get("jitter", 0.05)))

    mixup = float(options.get("mixup", 0.4))

    def loss(net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # Mixup on half the steps: python decides, numpy draws the weight, torch the pairing.
        x, y = batch
        if random.random() < 0.5:
            lam = float(np.random.beta(mixup, mixup))
            perm = torch.randperm(len(x), device=x.device)
            x, y = lam * x + (1 - lam) * x[perm], lam * y + (1 - lam) * y[perm]
        return F.mse_loss(net(x), y)

    return Task(model, dataset, loss)
