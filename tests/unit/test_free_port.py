"""The ports the local stack chooses ahead of binding them lie below the kernel's ephemeral
range, so no outgoing connection can take one in between.

Linux hands out ``ip_local_port_range`` both to ``bind(0)`` and to the local end of every
outgoing connection (https://docs.kernel.org/networking/ip-sysctl.html,
``ip_local_port_range``); a port chosen there and bound seconds later (a function is told its
own URL before its server starts) can meanwhile be taken by any connection on the machine."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from emulators import official


def test_a_chosen_port_is_below_the_ephemeral_range_and_free() -> None:
    ephemeral = official.ephemeral_ports()
    for _ in range(50):
        port = official.free_port()
        assert 1024 <= port < ephemeral.start
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind((official.HOST, port))  # nothing holds it


def test_the_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    source = tmp_path / "ip_local_port_range"
    source.write_text("40000\t50000\n")
    assert official.ephemeral_ports(source) == range(40000, 50001)
    assert official.ephemeral_ports(tmp_path / "missing") == range(32768, 61000)


class Scripted:
    """A stand-in for ``random.Random`` whose choices are given: ``ports``, then the last one
    again and again."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def choice(self, candidates: range) -> int:
        assert self.ports[0] in candidates
        return self.ports.pop(0) if len(self.ports) > 1 else self.ports[0]


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    held, free = official.free_port(), official.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((official.HOST, held))
        taken.listen()
        monkeypatch.setattr("emulators.official.random.Random", lambda: Scripted(held, held, free))
        assert official.free_port() == free


def test_with_nothing_free_below_the_range_an_ephemeral_port_is_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = official.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((official.HOST, held))
        taken.listen()
        monkeypatch.setattr("emulators.official.random.Random", lambda: Scripted(held))
        assert official.free_port() in official.ephemeral_ports()
