"""A write command exits 0 after its commit, with its commit notice sent (issue 31, item 5).

With REDIS_URL set, a command's commit notice goes to the Redis channel layer from the live
publisher's private loop (runtime.live). That loop's thread was still sending when the
interpreter exited: the notice was lost, or the thread was torn down mid-call and the process
aborted after its commit ("FATAL: exception not rethrown", exit 134), so a script trusting the
exit code started a second run. Real subprocesses, as an operator runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from channels_redis.core import RedisChannelLayer

from runtime.live import ALL_RUNS_GROUP
from runtime.models import Run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STARTS = 4
FORKS = 2
NOTICE_WAIT = 10.0  # seconds a sent notice may take to be read back


def _subscribe(redis_url: str) -> str:
    """A channel of its own in the runs list's group (every commit notice), for this test."""
    channel = f"live-exit-{uuid.uuid4().hex}"

    async def add() -> None:
        await RedisChannelLayer(hosts=[redis_url]).group_add(ALL_RUNS_GROUP, channel)

    asyncio.run(add())
    return channel


def _notices(redis_url: str, channel: str, expected: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (run id, state) of the ``run.commit`` messages read from ``channel`` until every
    one of ``expected`` came or NOTICE_WAIT seconds passed with some missing."""

    async def read() -> set[tuple[str, str]]:
        # Reads for longer than channels-redis's 5 s blocking pop (console.settings says why).
        layer = RedisChannelLayer(hosts=[{"address": redis_url, "socket_timeout": 30}])
        seen: set[tuple[str, str]] = set()
        deadline = time.monotonic() + NOTICE_WAIT
        try:
            while not expected <= seen and (left := deadline - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    message = await asyncio.wait_for(layer.receive(channel), left)
                    if message["type"] == "run.commit":
                        seen.add((message["run_id"], message["state"]))
        finally:
            await layer.group_discard(ALL_RUNS_GROUP, channel)
        return seen

    return asyncio.run(read())


def _succeeded(done, *, quiet: bool = True) -> str:
    """The command's stdout, once it is known to have exited 0 (without a traceback when
    ``quiet``: a failed live send is logged with one)."""
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert not quiet or "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout.strip()


def test_write_commands_exit_0_and_their_commit_notices_arrive(
    command, redis_url, start, work_inline
):
    source = start({"text": "done"})
    work_inline()
    channel = _subscribe(redis_url)
    created = []
    for n in range(STARTS):
        done = command("runtime_start", "--agent", "demo", "--input", f"{n}", REDIS_URL=redis_url)
        created.append(_succeeded(done))
    for _ in range(FORKS):
        done = command("runtime_fork", source, "--at-step", "1", REDIS_URL=redis_url)
        created.append(_succeeded(done))
    assert len(set(created)) == STARTS + FORKS
    paused, cancelled = created[:2]
    _succeeded(command("runtime_pause", paused, REDIS_URL=redis_url))
    _succeeded(command("runtime_cancel", cancelled, REDIS_URL=redis_url))
    states = dict(Run.objects.filter(id__in=created).values_list("id", "state"))
    assert states[cancelled] == "ended"  # a pause of an unclaimed run waits for its claim
    expected = {(run_id, "running") for run_id in created} | set(states.items())
    assert _notices(redis_url, channel, expected) >= expected


@contextlib.contextmanager
def _silent_redis() -> Iterator[str]:
    """A Redis URL whose server takes connections and never answers (a hung Redis)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


@pytest.mark.parametrize("layer", ["silent", "refused"])
def test_a_write_command_exits_0_whatever_the_channel_layer_does(command, layer):
    """A Redis that never answers (the sends hang) or refuses connections: the commit stands,
    the command exits 0 within the publisher's wait at exit, and the failure is logged."""
    with contextlib.ExitStack() as stack:
        if layer == "silent":
            url = stack.enter_context(_silent_redis())
        else:
            with socket.socket() as unused:  # a port nothing listens on once it is closed
                unused.bind(("127.0.0.1", 0))
                url = f"redis://127.0.0.1:{unused.getsockname()[1]}/0"
        began = time.monotonic()
        done = command("runtime_start", "--agent", "demo", "--input", "go", REDIS_URL=url)
        took = time.monotonic() - began
    run_id = _succeeded(done, quiet=False)
    assert Run.objects.filter(id=run_id).exists()
    assert took < 30, took  # the silent Redis's sends are given up on, not waited out
    assert "runtime.live" in done.stderr, done.stderr[-2000:]  # the lost notice is logged
