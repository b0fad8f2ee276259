"""``runtime_serve``'s processes: a child that dies is started again; children die with the
first process; IPv6 addresses are served (each a real process, really killed)."""

from __future__ import annotations

import os
import signal
import socket
import sys

import httpx
import pytest

from tests.runtime.support import wait_for
from tests.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def children_of(pid: int) -> set[int]:
    """The live children of ``pid``, whichever of its threads started them."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            found |= {int(child) for child in listed.read().split()}
    return {child for child in found if alive(child)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, whatever kill says
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; the parent-death signal")
def test_a_dead_child_is_replaced_and_children_die_with_the_first_process(manage) -> None:
    port = free_port()
    served = manage("runtime_serve", "--port", str(port), "--processes", "3", "--no-worker")
    wait_for(lambda: answers(f"http://127.0.0.1:{port}/healthz"), what="the server")
    first = wait_for(lambda: len(children_of(served.pid)) == 2 and children_of(served.pid))

    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "exited with code -9; starting another" in served.stderr, what="a restart")
    now = wait_for(lambda: len(children_of(served.pid)) == 2 and children_of(served.pid))
    assert victim not in now and first - {victim} <= now

    served.signal(signal.SIGKILL)  # no chance to stop its children itself
    wait_for(lambda: not any(alive(child) for child in now), what="the children to die")
    with pytest.raises(OSError):  # nothing serves the port any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_an_ipv6_address_is_served(manage) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    served = manage(
        "runtime_serve", "--host", "::1", "--port", str(port), "--processes", "2", "--no-worker"
    )
    wait_for(lambda: answers(f"http://[::1]:{port}/healthz"), what="the server on ::1")
    served.signal(signal.SIGTERM)
    code, err = served.wait(30)
    assert code == 0, err
    assert "Listen failure" not in err


@pytest.mark.parametrize(
    ("database_url", "said"),
    [
        (
            "postgres://postgres@127.0.0.1:5432/rt_no_such_database",
            "cannot reach the database (DATABASE_URL): connection failed: connection to server",
        ),
        ("sqlite:///{tmp}/empty.sqlite3", "unapplied: contenttypes.0001_initial"),
    ],
    ids=["missing", "unmigrated"],
)
def test_a_database_it_cannot_serve_from_stops_runtime_serve(
    manage, tmp_path, database_url, said
) -> None:
    served = manage(
        "runtime_serve",
        "--port",
        str(free_port()),
        DATABASE_URL=database_url.format(tmp=tmp_path),
        RUNTIME_VAR_DIR=str(tmp_path),
    )
    code, err = served.wait(60)
    assert code == 1
    assert said in err
    assert "running in-process" not in served.stdout  # no worker was started
