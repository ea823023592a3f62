"""The PyTorch ImageNet example's epoch loop in miniature, ported to legato: diff with imagenet_plain.py (the "before").

Epochs with `train_sampler.set_epoch`, torchvision-style augmentation drawn
from the global torch, numpy and python RNGs inside DataLoader workers, a
validation pass and a `StepLR` step after every epoch. Launch one process per
rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set:

    python examples/port/imagenet_legato.py OUT_DIR [WORKERS]

The port: a Session over the training loader with the model, optimizer and
scheduler, `session.epochs()` for the epoch loop and `session.batches()` for
what `train()` iterates (it gets the session instead of the loader), and
`if session.stopped: break` after it, so that a stop leaves validation and the
scheduler step to the resumed run. The workers' augmentation is seeded per sample from
(seed, epoch, index), so it resumes exactly at any batch and with any worker
count; with no workers (all in the main process) the port is bit for bit the
plain loop.
"""

import hashlib
import json
import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import legato


class Images(Dataset):
    """Small 12x12 'images' of 4 classes; training samples get a random crop, flip and brightness jitter."""

    def __init__(self, n, train):
        gen = torch.Generator().manual_seed(0 if train else 1)
        self.images = torch.rand(n, 1, 12, 12, generator=gen)
        self.labels = torch.randint(4, (n,), generator=gen)
        self.train = train

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image = self.images[index]
        if not self.train:
            return image[:, 2:10, 2:10], self.labels[index]
        top, left = torch.randint(0, 5, (2,)).tolist()  # RandomCrop
        image = image[:, top : top + 8, left : left + 8]
        if torch.rand(1) < 0.5:  # RandomHorizontalFlip
            image = image.flip(-1)
        image = image * (0.9 + 0.2 * random.random()) + float(np.random.normal(0, 0.01))  # ColorJitter-like
        return image, self.labels[index]


def train(session, model, criterion, optimizer, epoch, log):
    model.train()
    for _i, (images, target) in enumerate(session.batches()):
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log.append(loss.item().hex())
        session.report(loss)


def validate(val_loader, model, criterion):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for images, target in val_loader:
            total += criterion(model(images), target).item()
    return total


def main(out_dir, workers, epochs=3, batch_size=8):
    dist.init_process_group("gloo")
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    train_dataset, val_dataset = Images(128, train=True), Images(32, train=False)
    train_sampler = DistributedSampler(train_dataset)
    train_loader = DataLoader(train_dataset, batch_size=batch_size, shuffle=False, num_workers=workers, sampler=train_sampler)
    val_loader = DataLoader(val_dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(val_dataset, shuffle=False))
    log = []
    session = legato.Session(out_dir, model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader, total_epochs=epochs)
    for epoch in session.epochs():
        train_sampler.set_epoch(epoch)
        train(session, model, criterion, optimizer, epoch, log)
        if session.stopped:  # a stop cut the epoch: validation and the scheduler step run in the resumed run
            break
        log.append(("val", validate(val_loader, model, criterion).hex()))
        scheduler.step()
    params = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    with open(os.path.join(out_dir, f"result_rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"log": log, "params": params}, f)
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2))
