"""A torchtitan-style FSDP2 loop in miniature, plain: the "before" of a port (diff it with fsdp2_legato.py).

`fully_shard` on every transformer block and then on the root, over a 1-D
device mesh; a mixed precision policy (bfloat16 parameters, float32 gradient
reduction); activation checkpointing of every block; gradient accumulation
over micro-batches without gradient sync and without resharding after the
forward between them; AdamW with a warmup schedule; the user's own
DataLoader with a DistributedSampler; DCP's state dict helpers for the final
full state. Launch one process per rank with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set (gloo on CPU):

    python examples/port/fsdp2_plain.py OUT_DIR
"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

out_dir = sys.argv[1]
steps, accumulate, micro_batch = 24, 2, 4
vocab, block, dim, layers = 32, 8, 32, 3

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(0.1))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.tok(idx)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return self.head(x)


model = Transformer()
mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.layers:
    fully_shard(layer, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
fully_shard(model, mesh=mesh, mp_policy=mp_policy)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))

tokens = torch.randint(vocab, (600, block + 1), generator=torch.Generator().manual_seed(1))
dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
sampler = DistributedSampler(dataset, seed=7)
loader = DataLoader(dataset, batch_size=micro_batch * accumulate, sampler=sampler, drop_last=True)


def batches():
    for epoch in range(steps):  # more epochs than the steps need
        sampler.set_epoch(epoch)
        yield from loader


losses = []
for _step, (inputs, labels) in zip(range(steps), batches()):
    for micro, (x, y) in enumerate(zip(inputs.chunk(accumulate), labels.chunk(accumulate))):
        model.set_requires_gradient_sync(micro == accumulate - 1)
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / accumulate
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    losses.append(loss.item().hex())

full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
params = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in full.values())).hexdigest()
with open(os.path.join(out_dir, f"result_rank{rank}.json"), "w") as f:
    json.dump({"losses": losses, "params": params}, f)
dist.destroy_process_group()
