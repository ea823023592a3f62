"""The PyTorch DDP tutorial's multigpu.py Trainer on CPU (gloo), ported to legato: diff with ddp_tutorial_plain.py (the "before").

A `Trainer` class, the user's own `DataLoader` with torch's
`DistributedSampler`, `set_epoch` per epoch, a nested epoch/batch loop. Launch
one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set:

    python examples/port/ddp_tutorial_legato.py OUT_DIR

The port: a Session over the same DataLoader (same samples, same order, so an
uninterrupted run is bit for bit the plain one), `session.epochs()` and
`session.batches()` for the two loops, and the batch size read from the
loader instead of from a batch drawn for it (that draw moves the global RNG).
"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import legato


class MyTrainDataset(Dataset):
    def __init__(self, size):
        gen = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=gen), torch.rand(1, generator=gen)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, gpu_id, out_dir):
        self.gpu_id = gpu_id
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.out_dir = out_dir
        self.log = []

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        self.log.append(loss.item().hex())

    def _run_epoch(self, epoch):
        b_sz = self.train_data.batch_size
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}", file=sys.stderr)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.session.batches():
            self._run_batch(source, targets)

    def train(self, max_epochs):
        self.session = legato.Session(self.out_dir, model=self.model, optimizer=self.optimizer, loader=self.train_data,
                                      total_epochs=max_epochs)
        for epoch in self.session.epochs():
            self._run_epoch(epoch)


def main(out_dir, total_epochs=3, batch_size=8):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dataset = MyTrainDataset(256)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    train_data = DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False, sampler=DistributedSampler(dataset))
    trainer = Trainer(model, train_data, optimizer, dist.get_rank(), out_dir)
    trainer.train(total_epochs)
    params = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    with open(os.path.join(out_dir, f"result_rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"log": trainer.log, "params": params}, f)
    dist.destroy_process_group()
    return trainer.session.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
