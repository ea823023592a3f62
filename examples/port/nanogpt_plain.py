"""nanoGPT's train.py loop in miniature, plain DDP: the "before" of a port (diff it with nanogpt_legato.py).

Batches are drawn in the loop from the global torch RNG (`get_batch`), one
is prefetched into the next step, gradients accumulate over micro-steps with
`require_backward_grad_sync`, rank 0 estimates the loss now and then (drawing
more batches), and the learning rate follows the iteration number. Launch one
process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set:

    python examples/port/nanogpt_plain.py OUT_DIR
"""

import hashlib
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

out_dir = sys.argv[1]
max_iters = 24
gradient_accumulation_steps = 2
batch_size, block_size, vocab_size = 4, 8, 32
eval_interval, eval_iters = 10, 2
learning_rate, warmup_iters, min_lr = 1e-2, 4, 1e-3

dist.init_process_group("gloo")
ddp_rank = dist.get_rank()
master_process = ddp_rank == 0
torch.manual_seed(1337 + ddp_rank)
torch.set_num_threads(1)
data = torch.randint(vocab_size, (4000,), generator=torch.Generator().manual_seed(0))
train_data, val_data = data[:3600], data[3600:]


def get_batch(split):
    d = train_data if split == "train" else val_data
    ix = torch.randint(len(d) - block_size, (batch_size,))
    x = torch.stack([d[i : i + block_size] for i in ix])
    y = torch.stack([d[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, 32)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(32, vocab_size)

    def forward(self, idx, targets):
        logits = self.head(self.drop(self.emb(idx)))
        return logits, F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
model = DDP(model)
raw_model = model.module


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(eval_iters)
    for k in range(eval_iters):
        X, Y = get_batch("val")
        _, loss = raw_model(X, Y)
        losses[k] = loss.item()
    model.train()
    return losses.mean()


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    decay_ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)


log = []
X, Y = get_batch("train")  # fetch the very first batch
iter_num = 0
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0 and master_process:
        log.append(("val", estimate_loss().item().hex()))
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")  # prefetch the next batch while the GPU is busy
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    log.append((iter_num, loss.item().hex()))
    iter_num += 1
    # termination conditions
    if iter_num > max_iters:
        break

params = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in raw_model.parameters())).hexdigest()
with open(os.path.join(out_dir, f"result_rank{ddp_rank}.json"), "w") as f:
    json.dump({"log": log, "params": params}, f)
dist.destroy_process_group()
