"""Several server processes the documented way (README, "Several server processes"): two
``daphne console.asgi:application`` processes on two ports, as ``deploy/runtime-web@.service``
runs them, sharing the Redis channel layer (``REDIS_URL``), and a ``runtime_worker`` process,
all on one database. A run started and approved through one server streams its live deltas,
published by the worker, to a viewer of the other."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import APPROVAL, BASE, ROOT
from tests.api.sse import Event, parse
from tests.runtime.support import wait_for
from tests.servers import serving, stop
from tests.subprocesses import FAST_WORKER_ENV

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ANSWER = "token " * 40
# After the approval: the answer streamed in 20 chunks, 50 ms apart (live deltas), then ended.
STREAMED = {"text": ANSWER, "chunks": 20, "delay_ms": 50}


@contextmanager
def worker_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``manage.py runtime_worker`` running (as ``deploy/runtime-worker@.service`` runs it)
    until the block ends; then SIGTERM, and SIGKILL after 30 s."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runtime_worker", "--max-inflight", "4"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        stop(process, 30)


def test_a_viewer_of_one_server_sees_the_deltas_of_a_run_driven_through_another(
    make_user, subprocess_env, redis_url, tmp_path
) -> None:
    _, token = make_user("sam", "read", "resume", "operate")
    headers = {"Authorization": f"Bearer {token}"}
    env = {**subprocess_env, **FAST_WORKER_ENV, "REDIS_URL": redis_url}
    with (
        serving(env, tmp_path / "a.log") as server_a,
        serving(env, tmp_path / "b.log") as server_b,
        worker_process(env, tmp_path / "worker.log") as worker,
        httpx.Client(base_url=f"{server_b}{BASE}", headers=headers, timeout=30) as via_b,
    ):
        script = {"steps": [APPROVAL, STREAMED]}
        started = via_b.post(
            "/runs", json={"agent": "demo", "input": "go", "metadata": {"script": script}}
        )
        assert started.status_code == 201, started.text
        run_id = started.json()["id"]
        ticket = wait_for(
            lambda: via_b.get(f"/runs/{run_id}").json()["ticket"],
            timeout=60,
            what="the run to wait for its approval",
        )

        seen: list[Event] = []
        joined = threading.Event()  # the stream on A has joined the run's group

        def follow() -> None:
            url = f"{server_a}{BASE}/runs/{run_id}/events"
            params = {"live": 1, "timeout": 90}
            with httpx.stream("GET", url, params=params, headers=headers, timeout=90) as stream:
                assert stream.status_code == 200
                for event in parse(stream.iter_lines()):
                    seen.append(event)
                    joined.set()  # it joins the group before its first commit event

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert joined.wait(30), "no commit event from server A"

        body = {"ticket_id": ticket["id"], "kind": "approval", "decision": "approve"}
        approved = via_b.post(f"/runs/{run_id}/resume", json=body)
        assert approved.status_code == 200, approved.text
        reader.join(90)
        assert not reader.is_alive(), "the stream on server A did not end"
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        done = via_b.get(f"/runs/{run_id}").json()

    assert (done["state"], done["end_cause"]) == ("ended", "natural")
    last = done["messages"][-1]
    assert (last["role"], last["content"]) == ("assistant", ANSWER)
    kinds = [event.event for event in seen]
    assert kinds[-2:] == ["commit", "end"], kinds  # the answer's commit ends the run
    deltas = [event.data for event in seen if event.event == "delta"]
    assert deltas, f"server A forwarded no live delta: {kinds}"
    assert all(d["run_id"] == run_id and d["confirmed"] is False for d in deltas)
    assert all(d["kind"] == "text" and d["text"] in ANSWER for d in deltas), deltas
    # Every delta came before the commit of the answer it previews.
    assert max(i for i, kind in enumerate(kinds) if kind == "delta") < len(kinds) - 2
