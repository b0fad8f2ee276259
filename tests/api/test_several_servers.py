"""Several server processes the documented way (docs/processes.md, "Several server processes"): two
``daphne console.asgi:application`` processes on two ports, as ``deploy/runtime-web@.service``
runs them, sharing the Redis channel layer (``REDIS_URL``), and a ``runtime_worker`` process,
all on one database. A run started and approved through one server streams its live deltas,
published by the worker, to a viewer of the other."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

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


class GroupProbe:
    """A raw subscriber of runs' live groups through Redis that registers no interest (it
    sees what the worker publishes, watched or not), on its own thread and loop."""

    def __init__(self, redis_url: str, run_ids: list[str]) -> None:
        self.redis_url, self.run_ids = redis_url, run_ids
        self.messages: list[dict] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.channel = ""

    async def _run(self) -> None:
        from channels_redis.core import RedisChannelLayer

        from runtime.live import run_group

        self.layer = RedisChannelLayer(hosts=[{"address": self.redis_url, "socket_timeout": 30}])
        self.channel = await self.layer.new_channel()
        for run_id in self.run_ids:
            await self.layer.group_add(run_group(run_id), self.channel)
        self.ready.set()
        while (message := await self.layer.receive(self.channel))["type"] != "probe.stop":
            self.messages.append(message)
        await self.layer.close_pools()

    def __enter__(self) -> GroupProbe:
        self.thread.start()
        assert self.ready.wait(30), "the probe did not subscribe"
        return self

    def __exit__(self, *exc: object) -> None:
        from asgiref.sync import async_to_sync
        from channels_redis.core import RedisChannelLayer

        layer = RedisChannelLayer(hosts=[self.redis_url])
        async_to_sync(layer.send)(self.channel, {"type": "probe.stop"})
        self.thread.join(30)


def test_only_a_watched_run_publishes_its_deltas(
    make_user, subprocess_env, redis_url, tmp_path
) -> None:
    """Issue 29: a run nobody watches costs no publish; a run watched through server A has
    every delta, in order, published by the worker for a run driven through server B."""
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
        run_ids, tickets = [], []
        for _ in range(2):
            started = via_b.post(
                "/runs", json={"agent": "demo", "input": "go", "metadata": {"script": script}}
            )
            assert started.status_code == 201, started.text
            run_id = started.json()["id"]
            run_ids.append(run_id)
            tickets.append(
                wait_for(
                    partial(_ticket_of, via_b, run_id),
                    timeout=60,
                    what="the run to wait for its approval",
                )
            )
        watched, unwatched = run_ids
        seen: list[Event] = []
        joined = threading.Event()

        def follow() -> None:
            url = f"{server_a}{BASE}/runs/{watched}/events"
            params = {"live": 1, "timeout": 90}
            with httpx.stream("GET", url, params=params, headers=headers, timeout=90) as stream:
                assert stream.status_code == 200
                for event in parse(stream.iter_lines()):
                    seen.append(event)
                    joined.set()

        with GroupProbe(redis_url, run_ids) as probe:
            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            assert joined.wait(30), "no commit event from server A"
            for run_id, ticket in zip(run_ids, tickets, strict=True):
                body = {"ticket_id": ticket["id"], "kind": "approval", "decision": "approve"}
                approved = via_b.post(f"/runs/{run_id}/resume", json=body)
                assert approved.status_code == 200, approved.text
            reader.join(90)
            assert not reader.is_alive(), "the stream on server A did not end"
            wait_for(
                lambda: via_b.get(f"/runs/{unwatched}").json()["state"] == "ended",
                timeout=60,
                what="the unwatched run to end",
            )
            # The unwatched run's commit notice (always sent) comes after its deltas would.
            wait_for(
                lambda: any(
                    m["type"] == "run.commit" and m["run_id"] == unwatched and m["state"] == "ended"
                    for m in probe.messages
                ),
                timeout=30,
                what="the unwatched run's last commit notice",
            )
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]

    published = [m for m in probe.messages if m["type"] == "run.delta"]
    assert not [m for m in published if m["run_id"] == unwatched], "an unwatched run published"
    mine = [m for m in published if m["run_id"] == watched]
    assert "".join(m["text"] for m in mine) == ANSWER  # every delta, in order
    assert [m["offset"] for m in mine] == [
        len("".join(m["text"] for m in mine[:i])) for i in range(len(mine))
    ]
    forwarded = [event.data for event in seen if event.event == "delta"]
    assert "".join(d["text"] for d in forwarded) == ANSWER


def _ticket_of(client: Any, run_id: str) -> Any:
    """The run's open ticket through ``client`` (None while it has none)."""
    return client.get(f"/runs/{run_id}").json()["ticket"]
