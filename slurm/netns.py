"""Virtual nodes on one machine: a bridge, and per node a network namespace with its own address and name.

A node is a named network namespace joined to the project's own bridge by a
veth pair, with one address on the bridge's private subnet. A daemon runs
"on" a node when it is started through `node_command`: `nsenter` into the
node's network namespace, then `unshare` of a private mount and UTS
namespace in which the node's own hostname is set and its own files (an
/etc/hosts copy, a munge socket directory) are bind-mounted, then `exec` of
the daemon, so the pid that starts it is the daemon's pid. Not `ip netns
exec`: it remounts /sys, which leaves /sys/fs/cgroup empty, and slurmd
refuses to start there.

It must never touch an interface, namespace or address it did not create
(every name it makes starts with the given prefix), never route or NAT
anything beyond the bridge, and never build a shell string from values: the
one shell line here is a constant that takes its values as arguments.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

from legato.errors import UsageError
from legato.system import processes

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
# Runs inside the node's fresh namespaces as root: name the node, bind its files, then become the daemon.
# Arguments: hostname, then pairs of (source, target) up to "--", then the daemon's command line.
_ENTER = 'hostname "$1" || exit 1; shift; while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"'


def ip(*args: str, check: bool = True) -> bool:
    """One `ip` command; with `check`, a failure is a UsageError naming it."""
    result = processes.run_command(["ip", *args])
    if not result.ok and check:
        raise UsageError(f"devcluster: `ip {' '.join(args)}` failed: {result.error}")
    return result.ok


def subnet_taken(network: ipaddress.IPv4Network | ipaddress.IPv6Network, bridge: str) -> str | None:
    """A route on another interface that overlaps `network` (then the cluster must not use it), else None."""
    out = processes.output(["ip", "-4", "route", "show"]) or ""
    for line in out.splitlines():
        words = line.split()
        if not words or words[0] == "default":
            continue
        try:
            route = ipaddress.ip_network(words[0], strict=False)
        except ValueError:
            continue
        dev = words[words.index("dev") + 1] if "dev" in words else ""
        if route.overlaps(network) and dev != bridge:
            return line
    return None


def link_exists(name: str) -> bool:
    """Whether the network link `name` exists."""
    return ip("link", "show", "dev", name, check=False)


def create_bridge(name: str, address: str, prefix: int) -> None:
    """Create the bridge `name` with `address`/`prefix` and bring it up."""
    ip("link", "add", name, "type", "bridge")
    ip("addr", "add", f"{address}/{prefix}", "dev", name)
    ip("link", "set", name, "up")


def create_node(ns: str, veth: str, bridge: str, address: str, prefix: int) -> None:
    """The namespace `ns`, linked to `bridge` by `veth` (host side) and `eth0` (inside), at `address`."""
    ip("netns", "add", ns)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", veth, "master", bridge)
    ip("link", "set", veth, "up")
    ip("-n", ns, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    ip("-n", ns, "link", "set", "lo", "up")


def pids_in(ns: str) -> list[int]:
    """Processes whose network namespace is `ns` (our daemons and whatever they started)."""
    out = processes.output(["ip", "netns", "pids", ns]) or ""
    return [int(p) for p in out.split() if p.isdigit()]


def remove_node(ns: str, veth: str) -> None:
    """Remove the namespace (its `eth0` goes with it) and the host side of its link, where they exist."""
    if (NETNS_DIR / ns).exists():
        ip("netns", "delete", ns, check=False)
    if link_exists(veth):
        ip("link", "delete", veth, check=False)


def remove_bridge(name: str) -> None:
    """Delete the bridge `name` if it exists."""
    if link_exists(name):
        ip("link", "delete", name, "type", "bridge", check=False)


def node_command(ns: str, hostname: str, binds: list[tuple[Path, Path]], command: list[str]) -> list[str]:
    """The argument list that runs `command` on node `ns` under `hostname`, with `binds` (source, target) mounted."""
    pairs = [str(p) for pair in binds for p in pair]
    return [
        "nsenter",
        f"--net={NETNS_DIR / ns}",
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        _ENTER,
        "legato-node",
        hostname,
        *pairs,
        "--",
        *command,
    ]


def named_command(hostname: str, command: list[str]) -> list[str]:
    """The argument list that runs `command` in the root network namespace under its own `hostname`."""
    return ["unshare", "--uts", "--", "sh", "-c", 'hostname "$1" || exit 1; shift; exec "$@"', "legato-host", hostname, *command]
