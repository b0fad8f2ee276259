"""A worker exits promptly whatever its MCP servers do (issue 35): a stdio server that hangs in
a call, one that dies in it, one that also ignores SIGTERM, and an HTTP server that hangs.

Each test runs a real ``runtime_worker`` with the effects server (its pid written to a file),
measures the worker's exit from the moment its run ended (``--until-idle``) or from the
signal, against a bound made of the settings under test, checks the run's outcomes are the
ones the pinned policies give, and that no server process is left behind.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.mcp.sessions import CLOSE_SECONDS
from tests.runtime.mcp.support import TOKEN, free_port
from tests.runtime.support import assert_log_sound, calls, run_row, text_step, tool_step, wait_for
from tests.subprocesses import FAST_WORKER_ENV

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CALL_TIMEOUT = 2.0  # MCP_EFFECTS_CALL_TIMEOUT: the hung call's own bound
# After its run's last commit a worker closes the run's sessions (at most CLOSE_SECONDS; about
# 2 s for a hung stdio server, 4 s for one that ignores SIGTERM), sees it is idle at its next
# look (RUNTIME_IDLE_POLL_SECONDS), records its stop and leaves. LEAVE_SECONDS is the rest:
# the worker's own teardown and the interpreter's exit, on a loaded machine.
LEAVE_SECONDS = 5.0
IDLE_EXIT = CLOSE_SECONDS + float(FAST_WORKER_ENV["RUNTIME_IDLE_POLL_SECONDS"]) + LEAVE_SECONDS
# A first SIGTERM during a hung call: the call's boundary (its timeout, plus the 5 s the
# runtime allows past the SDK's own), then the same close and exit.
STOP_EXIT = CALL_TIMEOUT + 5 + CLOSE_SECONDS + LEAVE_SECONDS
STARTUP = 120  # a worker's start, claim and connection on a loaded machine


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Path]:
    """The file the stdio effects servers append their pids to; any still alive at teardown
    (a failed test) is killed, by its own pid."""
    path = tmp_path / "server-pids"
    yield path
    for pid in _pids(path):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _no_orphans(path: Path) -> None:
    pids = _pids(path)
    assert pids, "no stdio server was started"
    # Reparented servers are reaped by init at once; a live one is an orphan.
    wait_for(lambda: not any(map(_alive, pids)), timeout=2, what=f"servers {pids} to be gone")


def _ended(run_id: str) -> bool:
    return run_row(run_id).state == "ended"


def _exit_after_idle(worker, run_id: str) -> float:
    """Wait for the run to end, then for the worker to exit; return the seconds between."""
    wait_for(lambda: _ended(run_id), timeout=STARTUP + 60, what="the run to end")
    ended = time.monotonic()
    code, err = worker.wait(IDLE_EXIT)
    took = time.monotonic() - ended
    assert code == 0, err
    print(f"worker exit {took:.2f}s after its run ended (bound {IDLE_EXIT:g}s)")
    return took


@pytest.mark.parametrize(
    "misbehaviour",
    [
        {"MCP_EFFECTS_HOLD": "delete"},
        {"MCP_EFFECTS_HOLD": "delete", "MCP_EFFECTS_IGNORE_TERM": "1"},
        {"MCP_EFFECTS_EXIT": "delete"},
    ],
    ids=["hangs", "hangs-ignoring-sigterm", "dies"],
)
def test_until_idle_exits_whatever_the_stdio_server_does(
    start, spawn_worker, effects, mcp_env, servers, misbehaviour
):
    """The destructive call is Indeterminate at attempt 1 (its effect applied, no answer), the
    run goes on to its natural end, the worker leaves within IDLE_EXIT, no server is left."""
    run_id = start(tool_step(("effects__delete", {"key": "k"})), text_step(), agent="mcp_stdio")
    env = mcp_env(MCP_EFFECTS_CALL_TIMEOUT=str(CALL_TIMEOUT), MCP_EFFECTS_PIDS=str(servers))
    worker = spawn_worker(**env, **misbehaviour)
    assert _exit_after_idle(worker, run_id) < IDLE_EXIT

    (call,) = calls(run_id)
    assert (call.phase, call.attempt, call.effect_may_have_started) == ("indeterminate", 1, True)
    assert effects.applied(call.operation_id) == 1
    assert run_row(run_id).end_cause == "natural"
    assert_log_sound(run_id)
    _no_orphans(servers)


def test_until_idle_exits_when_the_http_server_hangs(
    start, spawn_worker, effects, mcp_env, http_server
):
    """The idempotent call hangs on its first application; it times out, is sent again with
    the same operation id on a new session and completes; the worker leaves within IDLE_EXIT
    although the server still hangs in the first request."""
    port = free_port()
    server = http_server(port)
    env = mcp_env(
        MCP_EFFECTS_URL=f"http://127.0.0.1:{port}/mcp",
        MCP_EFFECTS_TOKEN=TOKEN,
        MCP_EFFECTS_CALL_TIMEOUT=str(CALL_TIMEOUT),
    )
    run_id = start(tool_step(("effects__upsert", {"key": "k"})), text_step(), agent="mcp_http")
    assert _exit_after_idle(spawn_worker(**env), run_id) < IDLE_EXIT

    (call,) = calls(run_id)
    assert (call.phase, call.policy, call.attempt, call.is_error) == (
        "completed",
        "replay",
        2,
        False,
    )
    assert effects.applied(call.operation_id) == 2
    assert run_row(run_id).end_cause == "natural"
    assert server.poll() is None  # the server hangs on; only the worker's side was closed
    assert_log_sound(run_id)


def _hung_in_call(worker, effects, run_id: str) -> None:
    wait_for(
        lambda: calls(run_id) and effects.applied(calls(run_id)[0].operation_id) == 1,
        timeout=STARTUP,
        what="the server to hang in the call",
    )
    assert worker.process.poll() is None


def _serving(kind: str, manage, spawn_worker, env: dict[str, str]):
    """A worker that serves until stopped: ``runtime_worker``, or ``runtime_serve`` with its
    in-process worker."""
    if kind == "runtime_worker":
        return spawn_worker(until_idle=False, **env)
    return manage("runtime_serve", "--host", "127.0.0.1", "--port", str(free_port()), **env)


COMMANDS = pytest.mark.parametrize("kind", ["runtime_worker", "runtime_serve"])


@COMMANDS
def test_first_sigterm_stops_after_the_hung_call(
    start, manage, spawn_worker, effects, mcp_env, servers, kind
):
    """SIGTERM while the server hangs in a destructive call (and ignores SIGTERM): the call's
    boundary comes with its timeout (Indeterminate, committed), the run is released, and the
    process leaves within STOP_EXIT of the signal, its server stopped."""
    run_id = start(tool_step(("effects__delete", {"key": "k"})), text_step(), agent="mcp_stdio")
    env = mcp_env(
        MCP_EFFECTS_HOLD="delete",
        MCP_EFFECTS_IGNORE_TERM="1",
        MCP_EFFECTS_CALL_TIMEOUT=str(CALL_TIMEOUT),
        MCP_EFFECTS_PIDS=str(servers),
    )
    worker = _serving(kind, manage, spawn_worker, env)
    _hung_in_call(worker, effects, run_id)
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    code, err = worker.wait(STOP_EXIT)
    took = time.monotonic() - signalled
    print(f"{kind} exit {took:.2f}s after the first SIGTERM (bound {STOP_EXIT:g}s)")
    assert code == 0, err
    assert took < STOP_EXIT

    (call,) = calls(run_id)
    assert (call.phase, call.attempt) == ("indeterminate", 1)
    run = run_row(run_id)
    assert (run.state, run.lease_owner) == ("running", None)  # released for another worker
    _no_orphans(servers)


@COMMANDS
def test_second_sigterm_leaves_at_once_and_kills_the_servers(
    start, manage, spawn_worker, effects, mcp_env, servers, kind
):
    """Two SIGTERMs while the server hangs in a call with a long timeout: the process leaves
    at once (128 + SIGTERM), killing its stdio server's process group on the way out."""
    run_id = start(tool_step(("effects__delete", {"key": "k"})), text_step(), agent="mcp_stdio")
    env = mcp_env(
        MCP_EFFECTS_HOLD="delete", MCP_EFFECTS_IGNORE_TERM="1", MCP_EFFECTS_PIDS=str(servers)
    )
    worker = _serving(kind, manage, spawn_worker, env)
    _hung_in_call(worker, effects, run_id)
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "stopping after this boundary" in worker.stderr, what="the first signal")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    code, _ = worker.wait(LEAVE_SECONDS)
    print(f"{kind} exit {time.monotonic() - signalled:.2f}s after the second SIGTERM")
    assert code == 128 + signal.SIGTERM
    _no_orphans(servers)
