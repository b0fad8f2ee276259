"""The stdio MCP servers a process started, for a process that must leave at once.

The SDK starts every stdio server in a session of its own (``start_new_session``), so that
its shutdown reaches the server's children through the process group; the same makes a server
outlive a worker that exits without that shutdown (a second SIGTERM, ``os._exit``).
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress


def kill_servers() -> int:
    """SIGKILL the process group of every child of this process that leads its own session
    (the SDK starts each stdio MCP server so), for a process that must exit at once; return
    how many groups were signalled. Linux (/proc); elsewhere it signals nothing."""
    me, killed = os.getpid(), 0
    with suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    # pid (comm) state ppid pgrp session ...: comm may hold spaces
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            ppid, session = int(fields[1]), int(fields[3])
            if ppid == me and session == int(entry.name):
                with suppress(OSError):
                    os.killpg(session, signal.SIGKILL)
                    killed += 1
    return killed
