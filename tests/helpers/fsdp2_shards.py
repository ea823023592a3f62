"""One rank of the FSDP2 shard checks (launch one process per rank, gloo): legato.state.sharded on real DTensors.

    python tests/helpers/fsdp2_shards.py OUT_DIR

A two-layer model with dimensions the ranks do not divide evenly (FSDP2 pads
the last shards) is `fully_shard`ed per layer and at the root, trained one
step under a bfloat16 parameter policy, and its model, optimizer and gradient
state are turned into plain records and back:

- round trip: the records restore the model into perturbed parameters and a
  fresh optimizer (no state yet) bit for bit (torch.equal on every local
  shard), and the next step of both is identical;
- the records survive torch.save / torch.load(weights_only=True);
- another rank's shard is refused, naming its offsets;
- gradients of micro-batches run with the gradient sync off (not yet reduced) are refused, and saved once a
  synced backward reduced them;
- a DTensor in a component not registered as sharded is refused by the digest.

Each rank writes OUT_DIR/result_rank<R>.json with what it saw.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from legato.errors import UsageError
from legato.state.hashing import digest
from legato.state.owned import Gradients
from legato.state.sharded import MARK, ShardedGradients, Shards, meshes_of


def build(mesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed + dist.get_rank()))
    model(x).float().pow(2).sum().backward()
    optimizer.step()


def locals_of(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() for p in model.parameters()]


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    result: dict = {}

    model, optimizer = build(mesh)
    step(model, optimizer, 1)
    meshes = meshes_of(model)
    saved_model, saved_opt = Shards(model, meshes).state_dict(), Shards(optimizer, meshes).state_dict()
    saved_grads = Shards(Gradients(model), meshes).state_dict()
    buffer = io.BytesIO()
    torch.save({"model": saved_model, "optimizer": saved_opt, "grads": saved_grads}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    result["digest_survives_save"] = digest(loaded) == digest({"model": saved_model, "optimizer": saved_opt, "grads": saved_grads})
    result["uneven_local_shapes"] = [r[MARK]["local_shape"] for r in saved_model.values()]

    other, other_opt = build(mesh)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    Shards(other, meshes_of(other)).load_state_dict(loaded["model"])
    Shards(other_opt, meshes_of(other)).load_state_dict(loaded["optimizer"])
    Shards(Gradients(other), meshes_of(other)).load_state_dict(loaded["grads"])
    result["model_restored"] = all(torch.equal(a, b) for a, b in zip(locals_of(model), locals_of(other)))
    pairs = zip(model.parameters(), other.parameters())
    result["grads_restored"] = all(torch.equal(a.grad.to_local(), b.grad.to_local()) for a, b in pairs)
    optimizer.zero_grad()
    other_opt.zero_grad()
    step(model, optimizer, 2)
    step(other, other_opt, 2)
    result["next_step_identical"] = all(torch.equal(a, b) for a, b in zip(locals_of(model), locals_of(other)))

    records: list = [None] * dist.get_world_size()
    dist.all_gather_object(records, Shards(model, meshes).state_dict())
    try:
        Shards(other, meshes_of(other)).load_state_dict(records[(rank + 1) % len(records)])
        result["foreign_shard"] = "accepted"
    except UsageError as exc:
        result["foreign_shard"] = str(exc)

    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(9))
    model.set_requires_gradient_sync(False)
    model(x).float().sum().backward()
    try:
        ShardedGradients(Gradients(model), model).state_dict()
        result["unreduced"] = "saved"
    except UsageError as exc:
        result["unreduced"] = str(exc)
    model.set_requires_gradient_sync(True)
    model(x).float().sum().backward()
    result["reduced_saves"] = MARK in ShardedGradients(Gradients(model), model).state_dict()["grads"][0]

    try:
        digest(optimizer.state_dict())
        result["unregistered"] = "hashed"
    except UsageError as exc:
        result["unregistered"] = str(exc)
    (out / f"result_rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
