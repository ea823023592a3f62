"""One rank of a training job: logging, threads, seeds, process group, entrypoint, exit code.

`run_rank` is what every launcher calls on every rank (the local launcher of
`python -m legato`, and the submitit job function). It maps outcomes to exit
codes: 0 done, 75 stopped at a committed checkpoint, 2 a user-fixable problem
(printed as one paragraph by rank 0), 3 a resume that failed verification,
1 anything else (with its traceback).
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from legato.config import Config
from legato.dist.stop import StopFlag, stop_signals
from legato.errors import EXIT_FAILED, EXIT_OK, ResumeMismatchError, UsageError
from legato.events import Kind
from legato.paths import RunPaths
from legato.runtime.context import RunContext
from legato.runtime.devices import resolve_placement
from legato.runtime.entrypoint import resolve_entrypoint
from legato.runtime.rank_env import RankEnv
from legato.state.determinism import seed_everything
from legato.system.signals import parse_signal
from legato.system.threads import resolve_threads
from legato.voice import refusals_said_by_caller

log = logging.getLogger(__name__)


def setup_logging(rank: int) -> None:
    """Configure logging to stderr for this rank (level from LEGATO_LOG_LEVEL, default INFO), each line tagged with the rank."""
    logging.basicConfig(
        level=os.environ.get("LEGATO_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def run_rank(cfg: Config, env: RankEnv, on_event: Callable[[dict], None] | None = None) -> int:
    """Run this rank of the job to its end and return the exit code."""
    setup_logging(env.rank)
    # From here on the stop signal is only remembered; the session stops before its first step when it came during start-up.
    early = StopFlag(tuple(parse_signal(s) for s in stop_signals(cfg.slurm.signal, cfg.slurm.handle_sigterm)))
    _chaos_signal_at_start(cfg, env, early.signals[0])
    early.install()
    report = on_event or (lambda event: None)
    try:
        with refusals_said_by_caller():  # a refusal is said below, once, as for a bad config
            return _run(cfg, env, report)
    except UsageError as exc:
        if env.rank == 0:
            sys.stderr.write(f"error: {exc}\n")
        report({"event": Kind.ERROR, "rank": env.rank, "message": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    except ResumeMismatchError as exc:  # the resume already logged its paragraph (legato.voice.refuse)
        report({"event": Kind.ERROR, "rank": env.rank, "message": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    except Exception as exc:
        log.exception("rank %d failed", env.rank)
        message = f"{type(exc).__name__}: {exc}"
        report({"event": Kind.ERROR, "rank": env.rank, "message": message, "exit_code": EXIT_FAILED, "peer_lost": peer_lost(exc)})
        return EXIT_FAILED
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        early.uninstall()


# What gloo (and c10d's store) say when another rank's process or node went away mid-collective.
PEER_LOST_WORDS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote worker crashing",
    "remote worker hanging",
)


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` is this rank losing its peers (another rank died), not a fault of its own."""
    network_error = getattr(dist, "DistNetworkError", ())
    return isinstance(exc, network_error) or any(word in str(exc) for word in PEER_LOST_WORDS)


def _chaos_signal_at_start(cfg: Config, env: RankEnv, sig: signal.Signals) -> None:
    """chaos.signal_at_steps holding 0: the signal rank sends itself the stop signal during start-up, before the
    trainer's handler is installed (launchers start ranks with it blocked), in the run's first attempt only."""
    if env.rank != cfg.chaos.signal_rank or 0 not in cfg.chaos.signal_at_steps or RunPaths(cfg.run_dir).trajectory(env.rank).exists():
        return
    log.warning("chaos: rank %d sends itself %s during start-up", env.rank, sig.name)
    os.kill(os.getpid(), sig)


def _run(cfg: Config, env: RankEnv, on_event: Callable[[dict], None]) -> int:
    threads = resolve_threads(cfg.determinism.threads, env.local_world_size)
    torch.set_num_threads(threads.count)
    log.info("rank %d: %s torch threads", env.rank, threads.describe())
    entrypoint = resolve_entrypoint(cfg)
    seeds = seed_everything(cfg.determinism.seed, env.rank, cfg.determinism.mode)
    placement = resolve_placement(cfg.train, env.local_rank, env.local_world_size)
    log.info("rank %d trains on %s", env.rank, placement.describe())
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)
    # A backend named in the config gets its process group even for one rank, so one GPU exercises NCCL and DDP.
    if env.world_size > 1 or cfg.train.backend != "auto":
        dist.init_process_group(
            placement.backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(seconds=cfg.train.collective_timeout_s),
        )
    ctx = RunContext(cfg, env.rank, env.world_size, env.local_rank, placement.device, seeds, on_event, placement.amp_dtype)
    code = entrypoint(ctx)
    if dist.is_initialized():
        dist.destroy_process_group()
        # After an orderly end only (a lost peer can leave a collective waiting): a group the trainer's objects still
        # hold in reference cycles (a DDP model) ends now, its threads joined, not during the interpreter's shutdown.
        gc.collect()
    return EXIT_OK if code is None else int(code)
