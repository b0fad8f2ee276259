"""Worker registration: real worker processes register, beat, stop, and are flagged stale
when killed, on the Workers page and in ``runtime_workers``; a worker serves its metrics.
"""

from __future__ import annotations

import json
import signal
import socket

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console.management.groups import ensure_groups
from runtime.models import WorkerProcess
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
