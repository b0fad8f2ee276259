"""``runtime_serve``'s listening sockets: each child process listens on a socket of its own
bound to the first one's address (Linux, SO_REUSEPORT), and the kernel deals connections
among them; a port another server holds still stops the command."""

from __future__ import annotations

import os
import select
import socket

import pytest
from django.core.management.base import CommandError

from console.management.commands.runtime_serve import REUSE_PORT, Command, first_socket

pytestmark = pytest.mark.skipif(not REUSE_PORT, reason="SO_REUSEPORT balancing is Linux's")


def accepted(sock: socket.socket) -> int:
    """Accept every connection waiting on ``sock``; return how many there were."""
    sock.setblocking(False)
    count = 0
    while select.select([sock], [], [], 0.2)[0]:
        try:
            sock.accept()[0].close()
        except BlockingIOError:
            break
        count += 1
    return count


def test_children_listen_on_their_own_sockets_and_share_the_connections() -> None:
    first = first_socket("127.0.0.1", 0, processes=2)
    child = Command().child_socket(os.dup(first.fileno()))  # what a child inherits
    try:
        assert child.getsockname() == first.getsockname()
        assert child.fileno() != first.fileno()
        clients = [socket.create_connection(first.getsockname()) for _ in range(64)]
        counts = accepted(first), accepted(child)
        for client in clients:
            client.close()
    finally:
        first.close()
        child.close()
    assert sum(counts) == 64
    # Dealt by a hash of each connection's address: both get some (each 32 +- a few).
    assert min(counts) >= 8, counts


def test_a_port_another_server_holds_stops_the_first_process() -> None:
    held = first_socket("127.0.0.1", 0, processes=2)  # another server, several processes
    try:
        with pytest.raises(CommandError, match="cannot listen on 127.0.0.1"):
            first_socket("127.0.0.1", held.getsockname()[1], processes=2)
    finally:
        held.close()
