"""A tiny character-level GPT with dropout, on the generated corpus.

The dataset's random crop draws in the DataLoader workers from a generator
owned by (seed, epoch, sample index), so a mid-epoch resume sees the same
crops whatever the worker count.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from legato.state.sampler import sample_generator
from legato.tasks.corpus import make_corpus
from legato.tasks.task import Task


class CharCrops(torch.utils.data.Dataset):
    """Windows of `block + 1` tokens, each randomly shifted inside its own stride."""

    def __init__(self, tokens: torch.Tensor, block: int, stride: int, seed: int) -> None:
        self.tokens = tokens
        self.block = block
        self.stride = stride
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (len(self.tokens) - self.block - self.stride - 1) // self.stride

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = sample_generator(self.seed, self.epoch, index)
        start = index * self.stride + int(torch.randint(self.stride, (1,), generator=gen))
        chunk = self.tokens[start : start + self.block + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """One pre-norm transformer block: masked self-attention, then an MLP, each added to the residual."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small causal character-level transformer: token and position embeddings, `layers` blocks, a vocabulary head."""

    mask: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, vocab: int, block: int, dim: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(block, dim) / math.sqrt(dim))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((block, block), float("-inf")), diagonal=1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos[:t])
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def build(options: dict, seed: int) -> Task:
    """The "tiny_gpt" task: a TinyGPT on crops of a synthetic character corpus, with noise from every global generator."""
    text = make_corpus(int(options.get("sentences", 4000)), seed=0)
    vocab = sorted(set(text))
    tokens = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    block = int(options.get("block", 32))
    model = TinyGPT(
        vocab=len(vocab),
        block=block,
        dim=int(options.get("dim", 64)),
        layers=int(options.get("layers", 2)),
        heads=int(options.get("heads", 4)),
        dropout=float(options.get("dropout", 0.1)),
    )
    dataset = CharCrops(tokens, block, stride=int(options.get("stride", 16)), seed=seed)

    noise = float(options.get("token_noise", 0.1))

    def loss(net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # Training-time randomness from every global generator, as real loops have it:
        # python picks the context length, numpy the corruption rate, torch which tokens.
        x, y = batch
        t = random.randint(block // 2, block)
        x, y = x[:, :t], y[:, :t]
        rate = float(np.random.uniform(0.0, noise))
        corrupt = torch.rand(x.shape, device=x.device) < rate
        x = torch.where(corrupt, torch.randint_like(x, len(vocab)), x)
        logits = net(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    return Task(model, dataset, loss)
