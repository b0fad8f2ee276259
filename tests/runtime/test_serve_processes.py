"""``runtime_serve`` is one process: it serves IPv4 and IPv6 addresses (a busy port on either
stops it before a worker registers), refuses ``--processes`` with the way to run several,
and refuses a database it cannot serve from (each a real process)."""

from __future__ import annotations

import signal
import socket

import httpx
import pytest
from django.core.management import CommandError, call_command

from console.management.commands.runtime_serve import endpoint
from runtime.models import WorkerProcess
from tests.runtime.support import wait_for
from tests.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def ipv6_port() -> int:
    """A free port on the IPv6 loopback; skips the test where there is none."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            return probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("127.0.0.1", 8000, "tcp:port=8000:interface=127.0.0.1:backlog=1024"),
        ("0.0.0.0", 0, "tcp:port=0:interface=0.0.0.0:backlog=1024"),
        ("::1", 8000, r"tcp6:port=8000:interface=\:\:1:backlog=1024"),
        ("[::]", 8001, r"tcp6:port=8001:interface=\:\::backlog=1024"),
    ],
)
def test_the_endpoint_is_twisteds_documented_tcp_or_tcp6(host, port, expected) -> None:
    assert endpoint(host, port) == expected


def test_an_ipv6_address_is_served(manage) -> None:
    port = ipv6_port()
    served = manage("runtime_serve", "--host", "::1", "--port", str(port), "--no-worker")
    wait_for(lambda: answers(f"http://[::1]:{port}/healthz"), what="the server on ::1")
    assert f"http://[::1]:{port}/" in served.stdout
    served.signal(signal.SIGTERM)
    code, err = served.wait(30)
    assert code == 0, err
    assert "Listen failure" not in err


def test_a_busy_ipv6_port_stops_runtime_serve_before_a_worker_registers(manage) -> None:
    port = ipv6_port()
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", port))
        taken.listen()
        served = manage("runtime_serve", "--host", "::1", "--port", str(port))
        code, err = served.wait(60)
    assert code == 1
    assert f"cannot listen on ::1:{port}" in err
    assert "running in-process" not in served.stdout
    assert not WorkerProcess.objects.exists()


def test_processes_is_refused_with_the_way_to_run_several() -> None:
    with pytest.raises(CommandError) as refused:
        call_command("runtime_serve", "--processes", "2")
    message = str(refused.value)
    assert "\n" not in message
    assert 'docs/processes.md, "Several server processes"' in message
    assert "daphne" in message and "REDIS_URL" in message and "runtime_worker" in message


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
