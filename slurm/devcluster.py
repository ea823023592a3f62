"""A real one-node SLURM cluster on this machine, for trying legato's SLURM mode and for its tests.

`up` installs Debian's munge, slurmctld, slurmd, slurmdbd and MariaDB when
they are missing, writes the configs for one node sized from `slurmd -C`,
starts every daemon as root in the foreground of its own session (no
systemd), waits until the node is idle and `sacct` answers, and records what
it started in a state file. `down` stops exactly the processes it recorded,
by PID. Settings that make requeues fast (credential expiry, scheduler
interval, KillWait) are the defaults and can be overridden. It must never
stop a daemon it did not start, and never pass config strings to a shell.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from legato.errors import UsageError
from legato.slurm.slurmconf import PARTITION, Settings, node_line, slurm_conf
from legato.system import processes

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("LEGATO_DEVCLUSTER_DIR", "/run/legato-devcluster"))
SLURM_ETC = Path("/etc/slurm")
PACKAGES = ("munge", "slurm-client", "slurmctld", "slurmd", "slurmdbd", "mariadb-server")
BINARIES = ("munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd", "sbatch", "sacct")
DB_NAME, DB_USER, DB_PASS = "slurm_acct_db", "slurm", "legato-devcluster"
CLUSTER = "legato"
READY_TIMEOUT_S = 120.0
INSTALL_LOCK = Path("/run/legato-devcluster-install.lock")  # held while apt-get installs (root-only, as devcluster is)
APT_LOCK_WAIT_S = 600


@dataclass(frozen=True)
class Daemon:
    """A daemon a dev cluster started and recorded: its name, pid and log file."""

    name: str
    pid: int
    log: str

    def alive(self) -> bool:
        return processes.alive(self.pid)


def up(settings: Settings, say=print) -> list[Daemon]:
    """Bring the cluster up (idempotent); returns the daemons that run."""
    _require_root()
    recorded, previous = _load_state(), _load_settings()
    running = [d for d in recorded if d.alive()]
    # Same settings and the slurm.conf this version writes (one written by an older legato may lack a partition).
    if running and previous == settings and _conf_is(_slurm_conf_text(settings)) and _cluster_ready(settings.accounting):
        say("already up (same settings); nothing to do")
        return running
    stop_daemons(running, say)
    install_packages(say)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    daemons: list[Daemon] = []
    _write_slurm_conf(settings)  # the client commands (sacctmgr too) read it
    try:
        daemons.append(_start_munge())
        if settings.accounting:
            daemons.append(_start_mariadb())
            _create_database()
            _write_slurmdbd_conf()
            daemons.append(_start("slurmdbd", ["slurmdbd", "-D"]))
            _wait(lambda: _ok(["sacctmgr", "-n", "list", "cluster"]), "slurmdbd to answer")
        for path in (Path("/var/spool/slurmctld"), Path("/var/spool/slurmd"), Path("/var/log/slurm")):
            path.mkdir(parents=True, exist_ok=True)
        daemons.append(_start("slurmctld", ["slurmctld", "-D", "-i"]))
        daemons.append(_start("slurmd", ["slurmd", "-D"]))
        _save_state(daemons, settings)
        _wait(lambda: _node_state() in ("idle", "mixed", "allocated"), "the node to become idle", daemons)
        if settings.accounting:
            _ok(["sacctmgr", "-i", "add", "cluster", CLUSTER])
            _wait(lambda: _ok(["sacct", "-n", "-X", "-S", "now-1minute"]), "sacct to answer", daemons)
    except BaseException:
        say("devcluster: not up; stopping the daemons it started (their logs stay)")
        stop_daemons(daemons, say)
        (STATE_DIR / "state.json").unlink(missing_ok=True)
        raise
    return daemons


def down(say=print) -> None:
    """Stop the one-node cluster's recorded daemons and forget them (needs root)."""
    _require_root()
    daemons = _load_state()
    if not daemons:
        say("devcluster: nothing recorded as started; nothing to stop")
        return
    stop_daemons(daemons, say)
    (STATE_DIR / "state.json").unlink(missing_ok=True)


def status() -> tuple[list[Daemon], str | None]:
    """The recorded daemons and `sinfo`'s view of the node (None when the controller does not answer)."""
    daemons = _load_state()
    if not any(d.alive() for d in daemons):
        return daemons, None
    return daemons, processes.output(["sinfo", "-N", "-h", "-p", PARTITION, "-o", "%N %T %c CPUs %m MB"])


# -- install ---------------------------------------------------------------


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError("legato devcluster needs root (it installs packages and starts SLURM's daemons); run it as root or with sudo.")


def install_packages(say, packages: tuple[str, ...] = PACKAGES, binaries: tuple[str, ...] = BINARIES) -> None:
    """Install the Debian `packages` (apt-get) unless every one of `binaries` is on PATH already. One install at a
    time: the one-node and the multi-node cluster may come up at once (the test suite starts both together), and a
    second apt-get beside a running one fails on dpkg's lock instead of waiting for it."""
    if _installed(binaries):
        return
    if not shutil.which("apt-get"):
        raise UsageError("legato devcluster needs Debian's apt-get to install SLURM, munge and MariaDB, and this machine has none.")
    with FileLock(INSTALL_LOCK):
        if not _installed(binaries):  # another devcluster may have installed them while this one waited
            _apt_install(say, packages)


def _installed(binaries: tuple[str, ...]) -> bool:
    return all(shutil.which(b) for b in binaries)


def _apt_install(say, packages: tuple[str, ...]) -> None:
    say(f"installing {' '.join(packages)} (apt-get)...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # An apt-get of anybody else's (unattended-upgrades) is waited for, not failed on.
    install = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}", "install", "-y", "-q", "--no-install-recommends", *packages]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        proc = subprocess.run(install, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UsageError(
                f"apt-get could not install SLURM: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
            )


# -- daemons -----------------------------------------------------------------


def _start(name: str, cmd: list[str], user: str | None = None) -> Daemon:
    log_path = STATE_DIR / f"{name}.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, user=user, env=_daemon_environ()
        )
    return Daemon(name, proc.pid, str(log_path))


def _daemon_environ() -> dict[str, str]:
    """The caller's environment less TMPDIR: a private one (a SLURM job's, a test's) is closed to the daemons' own users,
    and MariaDB, running as mysql, then cannot make its temporary files and does not start."""
    return {name: value for name, value in os.environ.items() if name != "TMPDIR"}


def _runtime_dir(path: str, owner: str) -> None:
    """The daemon's socket directory under /run (a tmpfs: gone after a reboot)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    shutil.chown(path, owner, owner)


def _start_munge() -> Daemon:
    _runtime_dir("/run/munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    daemon = _start("munged", ["munged", "-F", "--force"], user="munge")
    _wait(_munge_works, "munge to answer", [daemon])
    return daemon


def _munge_works() -> bool:
    cred = subprocess.run(["munge", "-n"], capture_output=True)
    return cred.returncode == 0 and subprocess.run(["unmunge"], input=cred.stdout, capture_output=True).returncode == 0


def _start_mariadb() -> Daemon:
    _runtime_dir("/run/mysqld", "mysql")
    if not Path("/var/lib/mysql/mysql").is_dir():
        subprocess.run(["mariadb-install-db", "--user=mysql"], check=True, capture_output=True)
    daemon = _start("mariadbd", ["mariadbd", "--user=mysql", "--bind-address=127.0.0.1"])
    _wait(lambda: _ok(["mariadb", "-e", "SELECT 1"]), "MariaDB to answer", [daemon])
    return daemon


def _create_database() -> None:
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASS}'; "
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost'; FLUSH PRIVILEGES;"
    )
    subprocess.run(["mariadb", "-e", sql], check=True, capture_output=True)


def _write_slurmdbd_conf() -> None:
    path = SLURM_ETC / "slurmdbd.conf"
    SLURM_ETC.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "AuthType=auth/munge\nDbdHost=localhost\nSlurmUser=root\n"
        "StorageType=accounting_storage/mysql\nStorageHost=localhost\n"
        f"StorageUser={DB_USER}\nStoragePass={DB_PASS}\nStorageLoc={DB_NAME}\n"
        "PidFile=/run/slurmdbd.pid\nLogFile=/var/log/slurm/slurmdbd.log\n"
    )
    path.chmod(0o600)


def _write_slurm_conf(settings: Settings) -> None:
    SLURM_ETC.mkdir(parents=True, exist_ok=True)
    (SLURM_ETC / "slurm.conf").write_text(_slurm_conf_text(settings))


def _conf_is(text: str) -> bool:
    try:
        return (SLURM_ETC / "slurm.conf").read_text() == text
    except OSError:
        return False


def _slurm_conf_text(settings: Settings) -> str:
    files = {
        "StateSaveLocation": "/var/spool/slurmctld",
        "SlurmdSpoolDir": "/var/spool/slurmd",
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
        "SlurmdLogFile": "/var/log/slurm/slurmd.log",
    }
    return slurm_conf(settings, CLUSTER, socket.gethostname().split(".")[0], [node_line()], files)


def _node_state() -> str | None:
    out = processes.output(["sinfo", "-h", "-p", PARTITION, "-o", "%T"])
    return out.split()[0].rstrip("*~#") if out else None


def _cluster_ready(accounting: bool) -> bool:
    return _node_state() in ("idle", "mixed", "allocated") and (not accounting or _ok(["sacct", "-n", "-X", "-S", "now-1minute"]))


def stop_daemons(daemons: list[Daemon], say) -> None:
    """Stop exactly these recorded daemons by pid (SIGTERM, SIGKILL after 15 s), last started first."""
    # Reverse order: slurmd before slurmctld before slurmdbd before the database and munge.
    for daemon in reversed(daemons):
        if not daemon.alive():
            continue
        processes.kill(daemon.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while daemon.alive() and time.monotonic() < deadline:
            processes.reap(daemon.pid)
            time.sleep(0.1)
        if daemon.alive():
            processes.kill(daemon.pid, signal.SIGKILL)
        processes.reap(daemon.pid)
        say(f"stopped {daemon.name} (pid {daemon.pid})")


def _wait(ready, what: str, daemons: Sequence[Daemon] = ()) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        dead = [d for d in daemons if not d.alive()]
        if dead:
            raise UsageError(f"devcluster: {dead[0].name} exited while waiting for {what}; see {dead[0].log}.")
        time.sleep(0.5)
    raise UsageError(f"devcluster: gave up waiting for {what} after {READY_TIMEOUT_S:.0f}s; see the logs in {STATE_DIR}.")


def _ok(cmd: list[str]) -> bool:
    return processes.output(cmd) is not None


def _load_state() -> list[Daemon]:
    try:
        return [Daemon(**d) for d in json.loads((STATE_DIR / "state.json").read_text())["daemons"]]
    except (OSError, json.JSONDecodeError, TypeError, KeyError):
        return []


def _load_settings() -> Settings | None:
    try:
        return Settings(**json.loads((STATE_DIR / "state.json").read_text())["settings"])
    except (OSError, json.JSONDecodeError, TypeError, KeyError):
        return None


def _save_state(daemons: list[Daemon], settings: Settings) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state = {"settings": asdict(settings), "daemons": [asdict(d) for d in daemons]}
    (STATE_DIR / "state.json").write_text(json.dumps(state))
