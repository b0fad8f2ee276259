"""The live WebSocket consumers: refuse anonymous users and users without read permission,
send committed state first, forward deltas and commit notices."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.test import Client

from console.asgi import application
from console.routing import websocket_urlpatterns
from runtime.live import ALL_RUNS_GROUP, publish_delta, run_group

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

router = URLRouter(websocket_urlpatterns)


def communicator(path: str, user) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(router, path)
    comm.scope["user"] = user
    return comm


@pytest.fixture
def users(make_user):
    return {
        "viewer": make_user("vic", "viewers"),
        "nobody": make_user("nobody"),
    }


@pytest.fixture
def awaiting(approval_run):
    run, ticket_id = approval_run
    return run


async def test_anonymous_is_refused(awaiting):
    comm = communicator(f"/ws/runs/{awaiting.run_id}/", AnonymousUser())
    connected, code = await comm.connect()
    assert not connected
    comm = communicator("/ws/runs/", AnonymousUser())
    connected, _ = await comm.connect()
    assert not connected


async def test_user_without_read_permission_is_refused(users, awaiting):
    comm = communicator(f"/ws/runs/{awaiting.run_id}/", users["nobody"])
    connected, _ = await comm.connect()
    assert not connected
    comm = communicator("/ws/runs/", users["nobody"])
    connected, _ = await comm.connect()
    assert not connected


async def test_inactive_user_is_refused(users, awaiting):
    user = users["viewer"]
    user.is_active = False
    comm = communicator(f"/ws/runs/{awaiting.run_id}/", user)
    connected, _ = await comm.connect()
    assert not connected


async def test_committed_state_first_then_deltas_and_commits(users, awaiting):
    comm = communicator(f"/ws/runs/{awaiting.run_id}/", users["viewer"])
    connected, _ = await comm.connect()
    assert connected
    version = await sync_to_async(lambda: awaiting.view.version)()
    hello = await comm.receive_json_from()
    assert hello == {
        "event": "hello",
        "run_id": awaiting.run_id,
        "version": version,
        "state": "awaiting",
        "end_cause": None,
        "step": 1,
        "stream": None,
    }
    layer = get_channel_layer()
    await layer.group_send(
        run_group(awaiting.run_id),
        {
            "type": "run.delta",
            "run_id": awaiting.run_id,
            "step": 2,
            "attempt": 1,
            "kind": "text",
            "text": "<b>hi</b>",
            "index": 0,
            "name": None,
            "call_id": None,
        },
    )
    assert await comm.receive_json_from() == {
        "event": "delta",
        "step": 2,
        "attempt": 1,
        "claim": None,
        "kind": "text",
        "text": "<b>hi</b>",
        "index": 0,
        "name": None,
        "call_id": None,
        "offset": None,  # a delta sent without its place in the attempt's text
    }
    await layer.group_send(
        run_group(awaiting.run_id),
        {
            "type": "run.commit",
            "run_id": awaiting.run_id,
            "thread_id": "t",
            "seq": 9,
            "state": "running",
        },
    )
    assert await comm.receive_json_from() == {
        "event": "commit",
        "run_id": awaiting.run_id,
        "seq": 9,
        "state": "running",
    }
    # another run's stream is not forwarded
    await layer.group_send(run_group("other"), {"type": "run.delta", "step": 1, "attempt": 1})
    assert await comm.receive_nothing(timeout=0.2)
    await comm.disconnect()


async def test_the_runtime_publishers_reach_the_consumer(users, awaiting):
    """runtime.live's own functions (what the worker calls) arrive as JSON events."""
    comm = communicator(f"/ws/runs/{awaiting.run_id}/", users["viewer"])
    await comm.connect()
    await comm.receive_json_from()
    await sync_to_async(publish_delta)(
        awaiting.run_id,
        step=2,
        attempt=2,
        delta={
            "kind": "tool_call",
            "text": '{"ke',
            "index": 0,
            "name": "ledger_once",
            "call_id": "call_2_0",
        },
    )
    delta = await comm.receive_json_from()
    assert (delta["event"], delta["attempt"], delta["name"], delta["text"]) == (
        "delta",
        2,
        "ledger_once",
        '{"ke',
    )
    await comm.disconnect()


async def test_a_real_commit_is_announced(users, approval_run, make_user):
    run, ticket_id = approval_run
    comm = communicator(f"/ws/runs/{run.run_id}/", users["viewer"])
    await comm.connect()
    await comm.receive_json_from()
    runs = communicator("/ws/runs/", users["viewer"])
    assert (await runs.connect())[0]
    assert await runs.receive_json_from() == {"event": "hello"}
    from runtime import operations
    from runtime.domain.model import Decision, ResumeCommand, TicketKind

    await sync_to_async(operations.resume)(
        run.run_id,
        ResumeCommand(ticket_id=ticket_id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
        actor="abe",
    )
    version = await sync_to_async(lambda: run.view.version)()
    commit = await comm.receive_json_from(timeout=2)
    assert commit == {"event": "commit", "run_id": run.run_id, "seq": version, "state": "running"}
    assert (await runs.receive_json_from(timeout=2))["seq"] == version
    await comm.disconnect()
    await runs.disconnect()


async def test_unknown_run_is_closed_with_4404(users):
    comm = communicator("/ws/runs/nope/", users["viewer"])
    connected, _ = await comm.connect()
    assert connected
    output = await comm.receive_output()
    assert output == {"type": "websocket.close", "code": 4404}


async def test_runs_consumer_forwards_every_commit(users):
    comm = communicator("/ws/runs/", users["viewer"])
    await comm.connect()
    await comm.receive_json_from()
    await get_channel_layer().group_send(
        ALL_RUNS_GROUP,
        {"type": "run.commit", "run_id": "r", "thread_id": "t", "seq": 3, "state": "ended"},
    )
    assert await comm.receive_json_from() == {
        "event": "commit",
        "run_id": "r",
        "seq": 3,
        "state": "ended",
    }
    await comm.disconnect()


async def test_full_asgi_stack_uses_the_session(users, awaiting):
    """Through console.asgi: origin check, session auth, then the read permission."""
    client = Client()
    await sync_to_async(client.force_login)(users["viewer"])
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    path = f"/ws/runs/{awaiting.run_id}/"
    comm = WebsocketCommunicator(
        application, path, headers=[(b"cookie", cookie), (b"origin", b"http://testserver")]
    )
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from())["event"] == "hello"
    await comm.disconnect()
    # no session: refused
    anon = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://testserver")])
    assert not (await anon.connect())[0]
    # a foreign origin: refused before authentication
    foreign = WebsocketCommunicator(
        application, path, headers=[(b"cookie", cookie), (b"origin", b"http://evil.example")]
    )
    assert not (await foreign.connect())[0]


async def test_a_commit_the_layer_never_carried_still_reaches_viewers(users, approval_run):
    # A worker in another process on the in-memory layer cannot reach this process's
    # consumers: with the layer's announcement switched off, the consumers' look at the log
    # must still tell both pages that the run committed.
    from runtime import operations
    from runtime.domain.model import Decision, ResumeCommand, TicketKind
    from runtime.signals import commit_announced

    run, ticket_id = approval_run
    comm = communicator(f"/ws/runs/{run.run_id}/", users["viewer"])
    await comm.connect()
    await comm.receive_json_from()
    runs = communicator("/ws/runs/", users["viewer"])
    await runs.connect()
    await runs.receive_json_from()
    assert commit_announced.disconnect(dispatch_uid="runtime.live.forward")
    try:
        await sync_to_async(operations.resume)(
            run.run_id,
            ResumeCommand(ticket_id=ticket_id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
            actor="abe",
        )
        seen = await comm.receive_json_from(timeout=3)
        assert (seen["event"], seen["run_id"]) == ("commit", run.run_id)
        # Like a real notice, it names the commit, so a page that saw it ignores it (a
        # notice without seq once reset the live panel: issue 11, defect 3).
        version = await sync_to_async(lambda: run.view.version)()
        assert (seen["seq"], seen["state"]) == (version, "running")
        assert (await runs.receive_json_from(timeout=3))["event"] == "commit"
    finally:
        from runtime.apps import forward_commits

        commit_announced.connect(forward_commits, weak=False, dispatch_uid="runtime.live.forward")
    await comm.disconnect()
    await runs.disconnect()


async def test_hello_carries_the_in_flight_steps_text_so_far(users, new_run):
    # A viewer who opens the page after the stream began still sees its opening words: the
    # worker's checkpoint of the step being inferred rides in the hello (unconfirmed).
    from runtime.models import StreamCheckpoint

    run = await sync_to_async(new_run)()
    await sync_to_async(StreamCheckpoint.objects.create)(
        run_id=run.run_id, step=1, attempt=1, text="The opening words"
    )
    comm = communicator(f"/ws/runs/{run.run_id}/", users["viewer"])
    assert (await comm.connect())[0]
    hello = await comm.receive_json_from()
    # No claim: the checkpoint was not written by a worker's stream (it carries its lease
    # epoch when it is, so a late viewer can tell a takeover's text from the dead worker's).
    assert hello["stream"] == {
        "step": 1,
        "attempt": 1,
        "text": "The opening words",
        "claim": None,
    }
    await comm.disconnect()
