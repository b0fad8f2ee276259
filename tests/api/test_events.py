"""``GET /runs/{id}/events``: committed facts as Server-Sent Events, resumable without gaps
or repeats, with unconfirmed live deltas on request."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connections

from console.api.events import stream_run
from runtime import operations
from runtime.live import run_group
from tests.api.conftest import ROOT, SCENARIO, error_of
from tests.api.sse import parse


def events_of(chunks: list[str]):
    return list(parse("".join(chunks).split("\n")))


@pytest_asyncio.fixture
async def db_thread():
    """Close the connection that sync_to_async's shared thread opened for an async test, so
    that the test database can be dropped at the end."""
    yield
    await sync_to_async(connections.close_all)()


# -- refusals before any stream (in process) ----------------------------------------------------


@pytest.mark.django_db
def test_an_unknown_run_is_404(api):
    response = api.get("/runs/" + "0" * 32 + "/events")
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


@pytest.mark.django_db
def test_a_client_that_has_the_ended_runs_last_commit_gets_204(api, start):
    run = start({"text": "x"})
    ended = api.post(f"/runs/{run['id']}/cancel", {}).json()
    response = api.get(
        f"/runs/{run['id']}/events", headers={"Last-Event-ID": str(ended["version"])}
    )
    assert response.status_code == 204
    assert api.get(f"/runs/{run['id']}/events", after=ended["version"]).status_code == 204


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["x", "-1", str(2**63)])
def test_a_malformed_last_event_id_is_422(api, start, value):
    run = start({"text": "x"})
    response = api.get(f"/runs/{run['id']}/events", headers={"Last-Event-ID": value})
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"


@pytest.mark.django_db
def test_events_need_the_read_permission(api_as):
    response = api_as("nobody").get("/runs/" + "0" * 32 + "/events")
    assert response.status_code == 403


# -- the stream itself (in process, on the in-memory channel layer) ---------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_commits_then_end_and_live_deltas_without_ids(start, db_thread):
    run = await sync_to_async(start)({"text": "x"})
    stream = stream_run(run["id"], cursor=0, live=True, timeout=10)
    assert (await anext(stream)).startswith("retry:")
    (activation,) = events_of([await anext(stream)])
    assert (activation.event, activation.id) == ("commit", 1)
    assert activation.data["confirmed"] is True
    assert activation.data["events"][0]["type"] == "RunActivated"

    await get_channel_layer().group_send(
        run_group(run["id"]),
        {
            "type": "run.delta",
            "run_id": run["id"],
            "step": 1,
            "attempt": 1,
            "kind": "text",
            "text": "Hel",
        },
    )
    chunk = await anext(stream)
    assert "id:" not in chunk
    (delta,) = events_of([chunk])
    assert delta.event == "delta" and delta.id is None
    assert delta.data == {
        "run_id": run["id"],
        "step": 1,
        "attempt": 1,
        "kind": "text",
        "text": "Hel",
        "confirmed": False,
    }

    await sync_to_async(operations.cancel)(run["id"], actor="t")
    rest = events_of([chunk async for chunk in stream])
    assert [(e.event, e.id) for e in rest] == [("commit", 2), ("end", None)]
    assert rest[0].data["disposition"]["state"] == "ended"
    assert rest[1].data["end_cause"] == "cancelled"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_deltas_are_not_forwarded_unless_asked(start, db_thread):
    run = await sync_to_async(start)({"text": "x"})
    stream = stream_run(run["id"], cursor=1, live=False, timeout=0.6)
    await get_channel_layer().group_send(
        run_group(run["id"]), {"type": "run.delta", "run_id": run["id"], "kind": "text"}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks == ["retry: 1000\n\n"]  # the timeout closed it: nothing new was committed


# -- the real server: daphne, httpx, a worker in another process --------------------------------


def worker(env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runtime_worker", "--until-idle"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_commit_exactly_once_across_a_forced_reconnect(
    daphne, make_user, subprocess_env, run_worker
):
    _, token = make_user("sse", "read", "resume", "operate")
    http = httpx.Client(
        base_url=f"{daphne}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    run = http.post(
        "/runs", json={"agent": "demo", "input": "go", "metadata": {"script": SCENARIO}}
    ).json()
    events_url = f"/runs/{run['id']}/events"
    received: list[int] = []

    # First connection: the activation, then some of the worker's commits, then a hard close
    # while the worker is still committing (anything already in flight is lost with it).
    background = worker(subprocess_env)
    try:
        with http.stream("GET", events_url, params={"timeout": 60}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for event in parse(response.iter_lines()):
                assert event.event == "commit" and event.data["confirmed"] is True
                received.append(event.id)
                if len(received) == 3:
                    break  # leaving the block closes the connection mid-stream
    finally:
        assert background.wait(timeout=120) == 0
    awaiting = http.get(f"/runs/{run['id']}").json()
    assert awaiting["state"] == "awaiting"
    ticket = awaiting["ticket"]
    resumed = http.post(
        f"/runs/{run['id']}/resume",
        json={"ticket_id": ticket["id"], "kind": "approval", "decision": "approve"},
    )
    assert resumed.status_code == 200

    # Reconnect where the client left off; the worker finishes the run meanwhile.
    background = worker(subprocess_env)
    try:
        headers = {"Last-Event-ID": str(received[-1])}
        with http.stream("GET", events_url, headers=headers, params={"timeout": 60}) as response:
            assert response.status_code == 200
            events = list(parse(response.iter_lines()))
    finally:
        assert background.wait(timeout=120) == 0
    assert events[-1].event == "end" and events[-1].data["end_cause"] == "natural"
    received += [e.id for e in events if e.event == "commit"]

    log = http.get(f"/runs/{run['id']}/commits", params={"limit": 1000}).json()["items"]
    assert received == [c["seq"] for c in log]  # every commit, in order, exactly once
    assert log[-1]["disposition"]["state"] == "ended"

    # A client that has everything is told so (204), which stops an EventSource for good.
    again = http.get(events_url, headers={"Last-Event-ID": str(received[-1])})
    assert again.status_code == 204
    # A new client without a cursor gets the whole history and the end.
    with http.stream("GET", events_url, params={"timeout": 30}) as response:
        replay = list(parse(response.iter_lines()))
    assert [e.id for e in replay if e.event == "commit"] == received
    http.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_stream_over_daphne_needs_a_token(daphne):
    response = httpx.get(f"{daphne}/api/v1/runs/{'0' * 32}/events", timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
