"""A real multi-node SLURM cluster on this machine: N slurmd nodes, each its own network namespace, host and munge.

`up` creates a bridge with a private subnet, and per node a network namespace
joined to it by a veth pair (its own address), a private mount and UTS
namespace (its own hostname, its own /etc/hosts copy bind-mounted, its own
munge socket), in which that node's `munged` and `slurmd -N <node>` run.
slurmctld runs in the root network namespace under its own hostname (it
requires `SlurmctldHost` to be its hostname) and listens on the bridge's
address. All of it lives under its own state directory, config path
(`SLURM_CONF`), ports and socket paths, so it coexists with the one-node
cluster of `devcluster`. There is no accounting: sacct does not answer here
and legato reads job states from scontrol. `down` stops exactly the daemons
it recorded, by PID, ends what still runs in its namespaces (job steps that
a stopped slurmd left behind), and removes the namespaces, links and bridge.
It must never touch a link, namespace or address it did not create, route
anything beyond its bridge, or pass a value to a shell.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from legato.errors import UsageError
from legato.slurm import netns
from legato.slurm.devcluster import Daemon, install_packages, stop_daemons
from legato.slurm.slurmconf import PARTITION, Settings, node_line, slurm_conf
from legato.system import processes

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("LEGATO_MULTINODE_DIR", "/run/legato-multinode"))
SLURM_CONF = STATE_DIR / "slurm.conf"
MUNGE_DIR = STATE_DIR / "munge"  # the one socket path every node uses; each node binds its own directory there
MUNGE_SOCKET = MUNGE_DIR / "munge.socket"
PACKAGES = ("munge", "slurm-client", "slurmctld", "slurmd")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
TOOLS = ("ip", "nsenter", "unshare", "setpriv", "mount", "hostname")
SUBNET = ipaddress.ip_network(os.environ.get("LEGATO_MULTINODE_SUBNET", "10.213.71.0/24"))
BRIDGE = "legato-br0"
CONTROLLER = "legato-ctl"
CLUSTER = "legatomn"
CTLD_PORT, SLURMD_PORT = 6917, 6918  # the one-node cluster uses SLURM's defaults, 6817 and 6818
SLURMD_TIMEOUT_S = 30  # a node whose slurmd is gone is DOWN after this (default 300)
READY_TIMEOUT_S = 90.0
MAX_NODES = 32


@dataclass(frozen=True)
class Node:
    """One node of the multi-node cluster, by index: its hostname, host-side link, address and state folder."""

    index: int

    @property
    def name(self) -> str:
        return f"legato-n{self.index}"

    @property
    def veth(self) -> str:
        return f"lgv-n{self.index}"

    @property
    def address(self) -> str:
        return str(SUBNET.network_address + 10 + self.index)

    @property
    def dir(self) -> Path:
        return STATE_DIR / "nodes" / self.name


@dataclass
class State:
    """What `up` made, written as it goes, so that `down` can undo exactly that."""

    nodes: int = 0
    settings: dict = field(default_factory=dict)
    bridge: bool = False
    namespaces: list[int] = field(default_factory=list)
    daemons: list[dict] = field(default_factory=list)

    def running(self) -> list[Daemon]:
        return [d for d in self.daemon_list() if d.alive()]

    def daemon_list(self) -> list[Daemon]:
        return [Daemon(**d) for d in self.daemons]

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / "state.json").write_text(json.dumps(asdict(self)))

    def add(self, daemon: Daemon) -> Daemon:
        self.daemons.append(asdict(daemon))
        self.save()
        return daemon


def controller_address() -> str:
    """The controller's address: the bridge's, the first host of the subnet."""
    return str(SUBNET.network_address + 1)


def client_env(base: dict | None = None) -> dict:
    """The environment in which sbatch, squeue, scontrol (and legato's supervisor) talk to this cluster."""
    return dict(os.environ if base is None else base, SLURM_CONF=str(SLURM_CONF))


def up(nodes: int, settings: Settings, say=print) -> list[Daemon]:
    """Bring up a cluster of `nodes` nodes (idempotent: the same size and settings already up are left alone)."""
    _require_root()
    if not 2 <= nodes <= MAX_NODES:
        raise UsageError(f"devcluster --nodes {nodes}: give 2 to {MAX_NODES} nodes (omit --nodes for the one-node cluster).")
    settings = replace(settings, accounting=False)
    state = load_state()
    if state.running() and state.nodes == nodes and state.settings == asdict(settings) and _ready(nodes):
        say(f"already up ({nodes} nodes, same settings); nothing to do")
        return state.running()
    if state.daemons or state.namespaces or state.bridge:
        _teardown(state, say)
    install_packages(say, PACKAGES, BINARIES)
    _check_tools()
    started = time.monotonic()
    state = State(nodes=nodes, settings=asdict(settings))
    try:
        _build(state, settings)
    except BaseException:
        _teardown(state, say)
        raise
    say(f"{nodes} nodes up in {time.monotonic() - started:.1f}s; use it with: export SLURM_CONF={SLURM_CONF}")
    return state.running()


def down(say=print) -> None:
    """Tear down everything the recorded `up` made (needs root)."""
    _require_root()
    state = load_state()
    if not (state.daemons or state.namespaces or state.bridge):
        say("multi-node devcluster: nothing recorded as started; nothing to stop")
        return
    _teardown(state, say)


def status() -> tuple[list[Daemon], str | None]:
    """The recorded daemons and `sinfo`'s view of the nodes (None when the controller does not answer)."""
    state = load_state()
    daemons = state.daemon_list()
    if not state.running():
        return daemons, None
    return daemons, _sinfo()


def load_state() -> State:
    """The recorded state of the last `up`, or an empty State when there is none or it cannot be read."""
    try:
        return State(**json.loads((STATE_DIR / "state.json").read_text()))
    except (OSError, json.JSONDecodeError, TypeError):
        return State()


# -- building ------------------------------------------------------------------


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError("legato devcluster --nodes needs root (it creates network namespaces and starts SLURM's daemons); run it as root.")


def _check_tools() -> None:
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        raise UsageError(f"legato devcluster --nodes needs {', '.join(missing)} (iproute2, util-linux); install them and try again.")
    taken = netns.subnet_taken(SUBNET, BRIDGE)
    if taken:
        raise UsageError(
            f"devcluster --nodes: the subnet {SUBNET} overlaps a route of this machine ({taken}). "
            "Set LEGATO_MULTINODE_SUBNET to a free private /24, e.g. 10.213.72.0/24."
        )
    leftovers = [n for n in (BRIDGE, *(Node(i).veth for i in range(1, MAX_NODES + 1))) if netns.link_exists(n)]
    if leftovers:
        raise UsageError(
            f"devcluster --nodes: {', '.join(leftovers)} exist but are not recorded as ours; remove them with `ip link delete` first."
        )


def _build(state: State, settings: Settings) -> None:
    if STATE_DIR.exists():
        shutil.rmtree(STATE_DIR / "nodes", ignore_errors=True)
        shutil.rmtree(STATE_DIR / "ctld", ignore_errors=True)
    for path in (STATE_DIR / "ctld", MUNGE_DIR):
        path.mkdir(parents=True, exist_ok=True)
    nodes = [Node(i) for i in range(1, state.nodes + 1)]
    state.bridge = True
    state.save()
    netns.create_bridge(BRIDGE, controller_address(), SUBNET.prefixlen)
    hosts = _hosts_text(nodes)
    for node in nodes:
        state.namespaces.append(node.index)
        state.save()
        netns.create_node(node.name, node.veth, BRIDGE, node.address, SUBNET.prefixlen)
        (node.dir / "spool").mkdir(parents=True, exist_ok=True)
        (node.dir / "munge").mkdir(parents=True, exist_ok=True)
        (node.dir / "hosts").write_text(hosts)
    _write_conf(settings, nodes)
    _munge_dir(MUNGE_DIR)
    state.add(_start("munged-ctl", _munged()))
    for node in nodes:
        _munge_dir(node.dir / "munge")
        state.add(_start(f"munged-{node.name}", netns.node_command(node.name, node.name, _binds(node), _munged())))
    _wait(
        lambda: all((n.dir / "munge" / MUNGE_SOCKET.name).exists() for n in nodes) and MUNGE_SOCKET.exists(), "munge on every node", state
    )
    state.add(_start("slurmctld", netns.named_command(CONTROLLER, ["slurmctld", "-D", "-i", "-f", str(SLURM_CONF)])))
    for node in nodes:
        cmd = ["slurmd", "-D", "-N", node.name, "-f", str(SLURM_CONF)]
        state.add(_start(f"slurmd-{node.name}", netns.node_command(node.name, node.name, _binds(node), cmd)))
    _wait(lambda: _ready(state.nodes), f"{state.nodes} nodes to become idle", state)


def _binds(node: Node) -> list[tuple[Path, Path]]:
    return [(node.dir / "hosts", Path("/etc/hosts")), (node.dir / "munge", MUNGE_DIR)]


def _hosts_text(nodes: list[Node]) -> str:
    """Every node's /etc/hosts: the controller and all nodes on the bridge, so names (and the master address) resolve."""
    lines = ["127.0.0.1 localhost", f"{controller_address()} {CONTROLLER}", *(f"{n.address} {n.name}" for n in nodes)]
    return "\n".join(lines) + "\n"


def _munge_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    shutil.chown(path, "munge", "munge")


def _munged() -> list[str]:
    """munged as user munge, with its socket, pid, seed and log in the (per node bind-mounted) munge directory."""
    return [
        "setpriv",
        "--reuid=munge",
        "--regid=munge",
        "--init-groups",
        "munged",
        "-F",
        "--force",
        f"--socket={MUNGE_SOCKET}",
        f"--pid-file={MUNGE_DIR / 'munged.pid'}",
        f"--seed-file={MUNGE_DIR / 'munged.seed'}",
        f"--log-file={MUNGE_DIR / 'munged.log'}",
    ]


def _write_conf(settings: Settings, nodes: list[Node]) -> None:
    figures = " ".join(t for t in node_line().split() if not t.startswith(("NodeName=", "State=")))
    extra = [
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        # A task that dies (a killed rank) ends its step at once, as on most production clusters, instead of
        # leaving the other ranks to notice the broken connection.
        "KillOnBadExit=1",
    ]
    files = {
        "StateSaveLocation": str(STATE_DIR / "ctld"),
        "SlurmctldPidFile": str(STATE_DIR / "ctld" / "slurmctld.pid"),
        "SlurmctldLogFile": str(STATE_DIR / "ctld" / "slurmctld.log"),
        # %n is the node's name: one file serves every node (Debian's slurmd is not the multiple-slurmd build).
        "SlurmdSpoolDir": str(STATE_DIR / "nodes" / "%n" / "spool"),
        "SlurmdPidFile": str(STATE_DIR / "nodes" / "%n" / "slurmd.pid"),
        "SlurmdLogFile": str(STATE_DIR / "nodes" / "%n" / "slurmd.log"),
    }
    node_lines = [f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.address} {figures} State=UNKNOWN" for n in nodes]
    controller = f"{CONTROLLER}({controller_address()})"
    SLURM_CONF.write_text(slurm_conf(replace(settings, accounting=False), CLUSTER, controller, node_lines, files, extra, str(MUNGE_SOCKET)))


def _start(name: str, cmd: list[str]) -> Daemon:
    log_path = STATE_DIR / f"{name}.out"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=client_env()
        )
    return Daemon(name, proc.pid, str(log_path))


def _sinfo() -> str | None:
    return _client_output(["sinfo", "-N", "-h", "-p", PARTITION, "-o", "%N %T %c CPUs %m MB"]) if SLURM_CONF.exists() else None


def _ready(nodes: int) -> bool:
    if not SLURM_CONF.exists():
        return False
    out = _client_output(["sinfo", "-N", "-h", "-p", PARTITION, "-o", "%N %T"])
    states = [line.split()[1].rstrip("*~#") for line in (out or "").splitlines() if len(line.split()) == 2]
    return len(states) == nodes and all(s in ("idle", "mixed", "allocated") for s in states)


def _client_output(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=client_env(), timeout=10, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _wait(ready, what: str, state: State) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        dead = [d for d in state.daemon_list() if not d.alive()]
        if dead:
            raise UsageError(
                f"devcluster --nodes: {dead[0].name} exited while waiting for {what}; see {dead[0].log} and the logs under {STATE_DIR}."
            )
        time.sleep(0.2)
    raise UsageError(f"devcluster --nodes: gave up waiting for {what} after {READY_TIMEOUT_S:.0f}s; see the logs under {STATE_DIR}.")


# -- tearing down ----------------------------------------------------------------


def _teardown(state: State, say) -> None:
    stop_daemons(state.daemon_list(), say)
    for index in state.namespaces:
        node = Node(index)
        # Job steps outlive a stopped slurmd; whatever still runs in our namespace was started by our daemons.
        for pid in netns.pids_in(node.name):
            processes.kill(pid, signal.SIGKILL)
        netns.remove_node(node.name, node.veth)
    if state.bridge:
        netns.remove_bridge(BRIDGE)
    (STATE_DIR / "state.json").unlink(missing_ok=True)
    say(f"removed {len(state.namespaces)} node namespaces" + (f" and the bridge {BRIDGE}" if state.bridge else ""))
