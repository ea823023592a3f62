"""In-process tests of the local launcher's rendezvous port: drawn below the kernel's ephemeral range, where no
outgoing connection's source port can take it in the seconds before rank 0 listens on it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from legato.runtime import launch


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(launch.EPHEMERAL_PORTS.read_text().split()[0])
    ports = {launch.free_port() for _ in range(20)}
    assert all(launch.LOWEST_RENDEZVOUS_PORT <= port < low for port in ports)
    assert len(ports) > 1  # drawn, not the same port each time
    with socket.socket() as s:
        s.bind(("", ports.pop()))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a one-port range below the ephemeral ports and that port taken, the kernel's own choice is returned."""
    with socket.socket() as held:
        held.bind(("", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(launch, "LOWEST_RENDEZVOUS_PORT", taken)
        monkeypatch.setattr(launch, "_ephemeral_low", lambda: taken + 1)
        port = launch.free_port()
    assert port != taken and port > 0


def test_an_unreadable_range_is_taken_as_linuxs_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(launch, "EPHEMERAL_PORTS", tmp_path / "missing")
    assert launch._ephemeral_low() == 32768
    assert launch.LOWEST_RENDEZVOUS_PORT <= launch.free_port() < 32768
