"""One rank of a torchtitan-style loop: an optimizer container whose state_dict goes through torch's DCP helpers.

    python tests/helpers/titan_loop.py OUT_DIR --wrap fsdp2|ddp [--plain] [--steps N]

Like torchtitan's trainer: the model's parts are `fully_shard`ed (or wrapped in DDP), one AdamW per part sits in
an `OptimizersContainer` (an `Optimizer` whose `state_dict()`/`load_state_dict()` call `get_optimizer_state_dict`/
`set_optimizer_state_dict` with flattened keys), a warm-up LambdaLR per optimizer, gradient clipping. torch's helper
initialises an optimizer with no state by stepping it (with zero gradients and the learning rate at 0): a capture
at step 0 used to leave AdamW's step count one ahead of the plain loop's.

`--plain` runs the loop without legato; otherwise under a Session (stops planted through LEGATO_CHAOS_SIGNAL_AT).
Each rank writes OUT_DIR/result_rank<R>.json when training completes: every step's loss as float.hex, and the
digest of its model shards and optimizer state (local tensors, bits).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import legato

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class OptimizersContainer(torch.optim.Optimizer):
    """One optimizer per model part behind one Optimizer, as torchtitan's container is."""

    def __init__(self, parts: list[torch.nn.Module], lr: float) -> None:
        self.parts = parts
        self.optimizers = [torch.optim.AdamW(p.parameters(), lr=lr, weight_decay=0.1) for p in parts]
        torch.optim.Optimizer.__init__(self, [p for part in parts for p in part.parameters()], {"lr": lr})

    def step(self, closure: object = None) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        states = (get_optimizer_state_dict(part, opt, options=FLAT) for part, opt in zip(self.parts, self.optimizers))
        return {k: v for state in states for k, v in state.items()}

    def load_state_dict(self, state_dict: dict) -> None:
        for part, opt in zip(self.parts, self.optimizers):
            set_optimizer_state_dict(part, opt, optim_state_dict=state_dict, options=FLAT)


class SchedulersContainer:
    """A LambdaLR warm-up per optimizer of the container, stepped and saved together."""

    def __init__(self, container: OptimizersContainer) -> None:
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 4)) for o in container.optimizers]

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def state_dict(self) -> dict:
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict) -> None:
        for scheduler, saved in zip(self.schedulers, state["schedulers"]):
            scheduler.load_state_dict(saved)


def build(wrap: str, world: int) -> tuple[torch.nn.Module, torch.nn.Module, OptimizersContainer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 32))
    if wrap == "ddp":
        return model, DDP(model), OptimizersContainer([model], lr=3e-3)
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[1], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, model, OptimizersContainer([model], lr=3e-3)


def digest(*states: dict) -> str:
    h = hashlib.sha256()
    for state in states:
        for key, value in sorted(_leaves(state)):
            h.update(key.encode())
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                h.update(local.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(value).encode())
    return h.hexdigest()


def _leaves(tree: object, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}/{k}")]
    if isinstance(tree, (list, tuple)):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{prefix}/{i}")]
    return [(prefix, tree)]


def step(
    net: torch.nn.Module, model: torch.nn.Module, optimizers: OptimizersContainer, schedulers: SchedulersContainer, i: int, rank: int
) -> torch.Tensor:
    tokens = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1000 * i + rank))
    logits = net(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizers.step()
    schedulers.step()
    optimizers.zero_grad()
    return loss


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--wrap", choices=("fsdp2", "ddp"), required=True)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        model, net, optimizers = build(args.wrap, world)
        schedulers = SchedulersContainer(optimizers)
        if args.plain:
            losses = [step(net, model, optimizers, schedulers, i, rank).item().hex() for i in range(args.steps)]
        else:
            session = legato.Session(
                args.out,
                model=net,
                optimizer=optimizers,
                scheduler=schedulers,
                total_steps=args.steps,
                checkpoint=legato.CheckpointPolicy(agree_every_steps=1),
            )
            for i in session:
                session.report(step(net, model, optimizers, schedulers, i, rank))
            if session.exit_code != 0:
                return session.exit_code
            lines = (args.out / "trajectory" / f"rank{rank}.jsonl").read_text().splitlines()
            losses = [json.loads(line)["loss_hex"] for line in lines]
        args.out.mkdir(parents=True, exist_ok=True)
        states = [model.state_dict(), *(o.state_dict() for o in optimizers.optimizers)]
        (args.out / f"result_rank{rank}.json").write_text(json.dumps({"loss_hex": losses, "state": digest(*states)}))
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
