"""A 2-rank run whose checkpoints land on a filesystem that fills up: a real tmpfs of a given size, in a mount namespace
of its own (run this under `unshare -m --propagation private`, as root).

    python tests/helpers/full_disk.py OUT SIZE_KB LAUNCH...      the driver: mounts OUT/fs, runs each launch, records
    python tests/helpers/full_disk.py --rank RUN_DIR             one rank of the training loop (the driver starts them)

Each LAUNCH is `SIZE_KB` (remount the filesystem to that size first, 0: leave it) and `STOP` (the step after which
rank 1 is signalled, 0: none), joined by a colon. FULL_DISK_ASYNC=1 writes the periodic checkpoints in the background
(checkpoint.async). FULL_DISK_FILL_AFTER=N mounts the filesystem on the run's checkpoints directory alone and fills it
while background checkpoint N waits to be published (`fill_after`); FULL_DISK_READ_ONLY_AFTER=N mounts it there too and
remounts it read-only after step N, as an administrator or a failing disk (ext4's errors=remount-ro) would. After each
launch the driver writes OUT/launch<i>.json: both ranks' exit codes and stderr, the checkpoint directory's entries.
The tmpfs vanishes with the namespace, so at the end the run directory is copied to OUT/run (for its ledger, trajectories and manifests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

STEPS = 20
FILL_AFTER = "FULL_DISK_FILL_AFTER"
READ_ONLY_AFTER = "FULL_DISK_READ_ONLY_AFTER"


def rank(run_dir: Path) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import legato

    dist.init_process_group("gloo")
    legato.seed_everything(0, rank=dist.get_rank(), mode="fast")
    torch.set_num_threads(1)
    model = torch.nn.Linear(256, 256)
    net = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(STEPS, 4, 256, generator=torch.Generator().manual_seed(dist.get_rank()))
    session = legato.Session(
        run_dir,
        model=net,
        optimizer=optimizer,
        total_steps=STEPS,
        checkpoint=legato.CheckpointPolicy(
            every_steps=5, agree_every_steps=1, replay_steps=0, async_=os.environ.get("FULL_DISK_ASYNC") == "1"
        ),
    )
    for step in session:
        loss = F.mse_loss(net(data[step]), data[step].flip(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        session.report(loss)
        if FILL_AFTER in os.environ and dist.get_rank() == 0:
            fill_after(run_dir, step, int(os.environ[FILL_AFTER]))
        if os.environ.get(READ_ONLY_AFTER) == str(step) and dist.get_rank() == 0:
            subprocess.run(["mount", "-o", "remount,ro", str(run_dir / "checkpoints")], check=True)
    dist.destroy_process_group()
    return session.exit_code


def fill_after(run_dir: Path, step: int, checkpoint: int) -> None:
    """Rank 0, after each step: once background checkpoint `checkpoint` wrote every rank's files, fill the filesystem
    (a ballast file up to ENOSPC), so that its manifest finds no room; once the run recorded that checkpoint as failed,
    free it again. The report files are linked beside the ballast first: the publish deletes them just before it
    writes the manifest, and the pages they hold must not make room for it."""
    from legato.paths import RunPaths
    from legato.store.commit import tmp_dir

    paths = RunPaths(run_dir)
    tmp, ballast = tmp_dir(paths.checkpoints, checkpoint), paths.checkpoints / ".ballast"
    reports = [tmp / f".report_rank{rank}.json" for rank in range(2)]
    if step == checkpoint + 1:
        deadline = time.monotonic() + 300
        while not all(_written(report) for report in reports):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the background checkpoint of step {checkpoint} wrote no reports in 300 s")
            time.sleep(0.01)
        for report in reports:
            os.link(report, paths.checkpoints / f".held{report.name}")
        with open(ballast, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(1 << 16))
            except OSError:
                pass
        return
    failed = [json.loads(line) for line in paths.ledger.read_text().splitlines() if '"checkpoint_failed"' in line]
    if ballast.exists() and any(record["step"] == checkpoint for record in failed):
        for held in paths.checkpoints.glob(".held*"):
            held.unlink()
        ballast.unlink()


def _written(report: Path) -> bool:
    """The whole report is on the filesystem: a file that exists may still be between its creation and its write, and
    a fill then would fail the report's write (the files' phase, not the manifest this helper means to fail)."""
    try:
        json.loads(report.read_text())
    except (FileNotFoundError, ValueError):
        return False
    return True


def drive(out: Path, size_kb: int, launches: list[str]) -> int:
    from legato.runtime.launch import free_port

    fs = out / "fs"
    run_dir = fs / "run"
    if FILL_AFTER in os.environ or READ_ONLY_AFTER in os.environ:  # the run on the test's disk, its checkpoints alone on the tmpfs
        run_dir = out / "live"
        fs = run_dir / "checkpoints"
    fs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(fs)], check=True)
    for i, launch in enumerate(launches):
        resize, stop = (int(part) for part in launch.split(":"))
        if resize:
            subprocess.run(["mount", "-o", f"remount,size={resize}k", str(fs)], check=True)
        env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        if stop:
            env.update(LEGATO_CHAOS_SIGNAL_AT=str(stop), LEGATO_CHAOS_SIGNAL_RANK="1")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(run_dir)], env=dict(env, RANK=str(r)), stderr=subprocess.PIPE, text=True
            )
            for r in range(2)
        ]
        errs = [p.communicate(timeout=300)[1] for p in procs]
        entries = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        record = {"codes": [p.returncode for p in procs], "stderr": errs, "checkpoints": entries}
        (out / f"launch{i}.json").write_text(json.dumps(record))
    shutil.copytree(run_dir, out / "run")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        sys.exit(rank(Path(sys.argv[2])))
    sys.exit(drive(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
