"""Worker registration: real worker processes register, beat, stop, and are flagged stale
when killed, on the Workers page and in ``runtime_workers``; silent rows are forgotten; a
worker serves its metrics; ``runtime_serve``'s in-process worker starts only on a free port and
stops like a standalone one.
"""

from __future__ import annotations

import json
import signal
import socket
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from console.management.groups import ensure_groups
from runtime import inventory, registry
from runtime.models import Run, WorkerProcess
from tests.runtime.support import run_row, text_step, tool_step, wait_for
from tests.subprocesses import FAST_WORKER_ENV

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fast_leases(settings):
    """This process judges staleness with the workers' short lease (2 x 1 s)."""
    settings.RUNTIME_LEASE_SECONDS = float(FAST_WORKER_ENV["RUNTIME_LEASE_SECONDS"])


@pytest.fixture
def viewer_client() -> Client:
    user = get_user_model().objects.create_user(username="watcher", password="pw")
    user.groups.add(ensure_groups()["viewers"])
    client = Client()
    client.force_login(user)
    return client


def _status(worker_id: str, page: str) -> str:
    row = page.split(f'data-worker="{worker_id}"', 1)[1].split("</tr>", 1)[0]
    return row.split('data-status="', 1)[1].split('"', 1)[0]


def test_a_killed_worker_is_flagged_stale_with_the_run_it_held(
    start, spawn_worker, command, viewer_client, fast_leases
):
    run_id = start(tool_step(("slow", {"seconds": 30})), text_step())
    doomed = spawn_worker(until_idle=False, worker_id="doomed")
    wait_for(lambda: run_row(run_id).lease_owner == "doomed", what="the worker to hold the run")
    row = WorkerProcess.objects.get(id="doomed")
    assert (row.pid, row.stopped_at, row.concurrency) == (doomed.pid, None, 1)
    assert row.version

    page = viewer_client.get("/workers/").content.decode()
    assert _status("doomed", page) == "live"
    assert f'href="/runs/{run_id}/"' in page

    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    wait_for(
        lambda: _status("doomed", viewer_client.get("/workers/").content.decode()) == "stale",
        what="the killed worker to turn stale",
    )
    partial = viewer_client.get("/workers/", headers={"HX-Request": "true"})
    assert "<html" not in partial.content.decode()
    assert f'href="/runs/{run_id}/"' in partial.content.decode()
    assert _status("doomed", partial.content.decode()) == "stale"

    listed = command("runtime_workers", "--json")
    assert listed.returncode == 0, listed.stderr
    (doc,) = [w for w in json.loads(listed.stdout)["workers"] if w["id"] == "doomed"]
    assert (doc["status"], doc["pid"], doc["runs"]) == ("stale", doomed.pid, [run_id])
    plain = command("runtime_workers", "--stale")
    assert "doomed  STALE" in plain.stdout
    assert f"runs={run_id}" in plain.stdout


def test_a_stopped_worker_says_so(start, spawn_worker, command, fast_leases):
    start(text_step())
    code, err = spawn_worker(worker_id="tidy").wait(30)
    assert code == 0, err
    row = WorkerProcess.objects.get(id="tidy")
    assert row.stopped_at is not None
    listed = json.loads(command("runtime_workers", "--json").stdout)["workers"]
    assert [(w["id"], w["status"]) for w in listed] == [("tidy", "stopped")]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_worker_serves_its_own_metrics(start, manage):
    run_id = start(tool_step(("ledger_replay", {"key": "m"})), text_step())
    port = _free_port()
    served = manage("runtime_worker", "--worker-id", "scraped", "--metrics-port", str(port))
    wait_for(lambda: run_row(run_id).state == "ended", what="the run to end")
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'runtime_tool_calls_total{outcome="ok",policy="replay",tool="ledger_replay"} 1.0' in text
    commits = next(line for line in text.splitlines() if line.startswith("runtime_commits_total"))
    assert float(commits.split()[1]) >= 4
    served.signal(signal.SIGTERM)
    assert served.wait(10)[0] == 0


def test_a_metrics_port_in_use_stops_the_worker(manage):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = manage("runtime_worker", "--metrics-port", str(port)).wait(30)
    assert code != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in err


def _silent_row(worker_id: str, seconds: float, *, stopped: bool = False) -> None:
    """A worker row whose last heartbeat was ``seconds`` ago (stopped then, if ``stopped``)."""
    at = timezone.now() - timedelta(seconds=seconds)
    WorkerProcess.objects.create(
        id=worker_id,
        host="gone",
        pid=1,
        started_at=at,
        heartbeat_at=at,
        stopped_at=at if stopped else None,
    )


def _hold(run_id: str, worker_id: str) -> None:
    """Make ``worker_id`` the (expired) lease owner of ``run_id``, as a crash leaves it."""
    Run.objects.filter(id=run_id).update(
        lease_owner=worker_id, lease_expires_at=timezone.now() - timedelta(minutes=1)
    )


def test_silent_rows_holding_no_run_are_forgotten_after_the_forget_time(start, settings):
    settings.RUNTIME_WORKER_FORGET_SECONDS = 3600
    held = start(text_step())
    _silent_row("crashed", 7200)  # its runs were taken over: forgotten
    _silent_row("holder", 7200)  # still holds a run nobody took over: kept
    _hold(held, "holder")
    _silent_row("retired", 7200, stopped=True)  # stopped long ago: forgotten
    _silent_row("recent", 600)  # stale, but not for long enough: kept
    _silent_row("alive", 0)
    assert inventory.workers_by_status()["stale"] == 3

    registry.forget_expired()
    assert set(WorkerProcess.objects.values_list("id", flat=True)) == {"holder", "recent", "alive"}

    settings.RUNTIME_WORKER_FORGET_SECONDS = 0  # never
    _silent_row("kept", 7200)
    registry.forget_expired()
    assert WorkerProcess.objects.filter(id="kept").exists()


def test_a_live_worker_forgets_a_crashed_workers_row(start, spawn_worker, fast_leases):
    _silent_row("crashed", 600)
    assert inventory.workers_by_status()["stale"] == 1
    fresh = spawn_worker(until_idle=False, worker_id="fresh", RUNTIME_WORKER_FORGET_SECONDS="60")
    wait_for(
        lambda: not WorkerProcess.objects.filter(id="crashed").exists(),
        what="the live worker to forget the crashed one",
    )
    assert inventory.workers_by_status() == {"live": 1, "stale": 0, "stopped": 0}
    fresh.signal(signal.SIGTERM)
    assert fresh.wait(10)[0] == 0


def test_forget_stale_clears_stale_rows_by_hand_and_keeps_those_holding_runs(start, command):
    # 15 s leases in the command (stale after 30 s): "alive" stays live however slowly the
    # command starts on a loaded machine, and the others are stale.
    held = start(text_step())
    _silent_row("crashed", 120)
    _silent_row("holder", 120)
    _hold(held, "holder")
    _silent_row("retired", 120, stopped=True)
    _silent_row("alive", 0)
    done = command("runtime_workers", "--forget-stale", RUNTIME_LEASE_SECONDS="15")
    assert done.returncode == 0, done.stderr
    assert "forgot crashed" in done.stdout
    assert f"kept holder: holds {held}" in done.stdout
    assert set(WorkerProcess.objects.values_list("id", flat=True)) == {"holder", "retired", "alive"}


def test_a_busy_port_stops_runtime_serve_before_a_worker_registers(manage):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = manage("runtime_serve", "--port", str(port))
        code, err = served.wait(60)
    assert code != 0
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "--port" in err and "PORT=" in err
    assert "running in-process" not in served.stdout
    assert not WorkerProcess.objects.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_runtime_serve_stops_its_worker_like_runtime_worker(start, manage, fast_leases, signum):
    run_id = start(tool_step(("slow", {"seconds": 30})), text_step())
    port = _free_port()
    served = manage("runtime_serve", "--port", str(port))
    owner = wait_for(lambda: run_row(run_id).lease_owner, what="the in-process worker's claim")
    wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), what="the server to answer")
    assert WorkerProcess.objects.get(id=owner).pid == served.pid

    served.signal(signum)
    code, err = served.wait(30)
    assert code == 0, err
    assert f"worker {owner}: stopped" in err
    # The lease is given back at once (no wait for its expiry) and the row says stopped.
    assert (run_row(run_id).state, run_row(run_id).lease_owner) == ("running", None)
    row = WorkerProcess.objects.get(id=owner)
    assert inventory.worker_status(row) == "stopped"
    with pytest.raises(OSError):  # no server process is left behind
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
