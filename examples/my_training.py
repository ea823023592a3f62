"""A user entrypoint on legato's public API, run by `legato run` / `legato verify` as `train.entrypoint: "my_training:main"`.

With `examples/` on PYTHONPATH:

    PYTHONPATH=examples legato verify configs/tiny_gpt.yaml --set train.entrypoint=my_training:main --interrupt-at 9

`train.options.unseeded_noise: true` plants a classic bug for `legato verify`
to find: noise from a generator seeded by the clock, which no run reproduces.
"""

import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from legato import RunContext


def main(ctx: RunContext) -> int:
    features = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    targets = features @ torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
    dataset = torch.utils.data.TensorDataset(features, targets)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    net = DDP(model) if ctx.world_size > 1 else model
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.cfg.train.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    noise = torch.Generator().manual_seed(time.time_ns()) if ctx.options.get("unseeded_noise") else None
    # The planted noise is non-determinism for `legato verify` to name, not state to save: the census is told to ignore it.
    session = ctx.session(model=net, optimizer=optimizer, scheduler=scheduler, loader=ctx.loader(dataset), ignore=[noise] if noise else ())
    for x, y in session:
        if noise is not None:
            x = x + 1e-3 * torch.randn(x.shape, generator=noise)
        loss = F.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        session.report(loss)
    return session.exit_code
