"""Issue 6, the main job on real input, end to end.

The product is started by the README's own command (``./scripts/start``) on a fresh SQLite
file, with an agent (``tests.e2e.agents.calculator``) on the OpenAI-compatible provider whose
base URL is a loopback server replaying a real recorded conversation: the model calls
``multiply(a=1231, b=2331)`` (``openai-stream-single-tool.json``), then, given the result
``2869461``, streams its final answer (``openai-stream-text.json``). Everything is driven over
HTTP (the JSON API with a Bearer token, the console with the operator's login); the effect
ledger and the log checker are read with the product's own commands.

What each variant checks: the real tool call is committed (Requested, then Awaiting behind an
approval ticket) before anything runs; it is approved through the API; it executes exactly
once (one ledger row for its operation id, applied once); its result is published (a committed
``tool`` message); the final answer streams live as unconfirmed deltas (``GET
/runs/{id}/events?live=1``) ahead of its commit and is committed; the run ends ``natural``;
the console's run page shows it; ``runtime_fsck`` finds the log and projections consistent.

Variants:

* ``uninterrupted``: ``./scripts/start`` as the README says, with its in-process worker and
  the in-memory channel layer (the embedded default).
* ``killed_mid_stream`` and ``killed_after_executing``: the worker must be killable on its own,
  so the server is started by the same command with ``--no-worker`` and the worker runs as
  ``manage.py runtime_worker`` processes (README, "Workers"), killed by ``RUNTIME_CRASH_AT``.
  Live deltas then travel from a worker process to the server, which needs the production
  channel layer: a private ``redis-server`` (or ``RUNTIME_TEST_REDIS_URL``) as ``REDIS_URL``.
  Mid-stream: one worker dies in the middle of the first turn's stream, the next in the middle
  of the final answer's stream, and a third finishes; each retry sends the same request again
  and gets the same recording. After Executing: the worker dies once the call's Executing
  attempt is committed and before the effect; the next worker replays it (policy ``replay``,
  same operation id) as attempt 2.

Requests are answered by content, not by order: a request that holds a ``tool`` message gets
the final-answer recording, any other the tool-call recording. The first turn's request body
equals the recording's exactly. The second turn's cannot: the recording's client (simonw/llm)
sent an extra empty assistant message and re-serialised the arguments as ``{"a": 1231, "b":
2331}``, while this runtime sends the one assistant message it committed, with the argument
text exactly as the model streamed it (``{"a":1231,"b":2331}``); the test compares the two
bodies with just those differences normalised away.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.sse import Event, parse
from tests.providers.replay import ReplayServer, Reply, Seen, load_fixture

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
AGENT_PATH = "tests.e2e.agents.calculator"
QUESTION = "What is 1231 * 2331?"
TOOL_TURN = load_fixture("openai-stream-single-tool.json")
TEXT_TURN = load_fixture("openai-stream-text.json")
CALL_ID = "call_1EYWDzueHEp8OsB8jJSEp7WB"  # the recorded tool call's id
RESULT = str(1231 * 2331)  # "2869461", the tool result the second recording was made with
PAUSE = 0.03  # seconds between two SSE events from the replay server: a visibly live stream
# Short leases, so that the next worker takes over a killed worker's run within a second.
FAST = {
    "RUNTIME_LEASE_SECONDS": "1",
    "RUNTIME_HEARTBEAT_SECONDS": "0.3",
    "RUNTIME_IDLE_POLL_SECONDS": "0.05",
}
WAIT = 60.0  # the longest any one phase may take
START_WAIT = 180.0  # scripts/start first reinstalls .venv when pyproject.toml changed


def recorded_text(fixture: dict[str, Any]) -> str:
    """The text of a recorded chat-completions stream, from its content deltas."""
    parts = []
    for line in fixture["response"]["body"].splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:])["choices"]:
            parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


FINAL_TEXT = recorded_text(TEXT_TURN)


def normalised(body: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions body without empty assistant messages, with parsed arguments."""
    messages = []
    for m in body["messages"]:
        if m["role"] == "assistant" and not m.get("content") and not m.get("tool_calls"):
            continue
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        messages.append(m)
    return {**body, "messages": messages}


# -- the model: a loopback server replaying the recorded conversation ---------------------------


@dataclass(frozen=True, kw_only=True)
class SlowReply(Reply):
    """A reply split at SSE event boundaries, with a pause before each event after the first."""

    pause: float = 0.0

    def pieces(self) -> Iterator[bytes]:
        for n, piece in enumerate(super().pieces()):
            if n and self.pause:
                time.sleep(self.pause)
            yield piece


class Conversation(ReplayServer):
    """Answers each request by its content: the final answer once a tool result is in it."""

    def __init__(self, pause: float = PAUSE) -> None:
        super().__init__()
        options = {"framing": "chunked", "split": True, "pause": pause}
        self.tool_turn = SlowReply.from_fixture(TOOL_TURN, **options)
        self.text_turn = SlowReply.from_fixture(TEXT_TURN, **options)
        self._server.take = self._take  # type: ignore[method-assign]

    def _take(self, seen: Seen) -> Reply:
        with self._server.lock:
            self._server.seen.append(seen)
        body = seen.body if isinstance(seen.body, dict) else {}
        messages = body.get("messages")
        if seen.path != "/v1/chat/completions" or not isinstance(messages, list):
            return Reply.json(404, {"error": {"message": f"nothing recorded for {seen.path}"}})
        if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
            return self.text_turn
        return self.tool_turn

    def turns(self) -> list[str]:
        """Which recording each request got, in order: "tool" or "text"."""
        return [
            "text" if any(m.get("role") == "tool" for m in s.body["messages"]) else "tool"
            for s in self.seen
        ]


# -- the product: ./scripts/start, worker processes and manage.py commands ----------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A subprocess of the product in its own process group; output goes to files."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.log = args, log
        self.out, self.err = log.with_suffix(".out"), log.with_suffix(".err")
        with self.out.open("wb") as stdout, self.err.open("wb") as stderr:
            self.popen = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float = WAIT) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.args} did not exit within {timeout}s:\n{self.stderr[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to this process's own group, SIGKILL after 10 s."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


class Product:
    """One installation: its own RUNTIME_VAR_DIR (a fresh SQLite file) and environment."""

    def __init__(self, home: Path, model_url: str, redis_url: str | None) -> None:
        self.home = home
        self.logs = home / "logs"
        self.logs.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RUNTIME_", "DJANGO_", "PYTEST_"))
            and k not in ("DATABASE_URL", "REDIS_URL")
        }
        self.env = {
            **inherited,
            **FAST,
            "RUNTIME_VAR_DIR": str(home / "var"),
            "RUNTIME_AGENTS": f"runtime.demo.agent.demo,{AGENT_PATH}",
            "RUNTIME_CALCULATOR_BASE_URL": model_url,
            "PORT": str(self.port),
            "PYTHONUNBUFFERED": "1",
        }
        if redis_url:
            self.env["REDIS_URL"] = redis_url
        self.processes: list[Process] = []

    def spawn(self, name: str, args: list[str], **env: str) -> Process:
        log = self.logs / f"{len(self.processes)}-{name}"
        process = Process(args, {**self.env, **env}, log)
        self.processes.append(process)
        return process

    def start(self, *extra: str) -> Process:
        """``./scripts/start [extra]``; return once the console answers."""
        server = self.spawn("start", ["./scripts/start", *extra])
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            if not server.alive():
                pytest.fail(f"scripts/start exited:\n{server.stdout}\n{server.stderr}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/login/", timeout=2).status_code == 200:
                    return server
            time.sleep(0.2)
        pytest.fail(f"scripts/start did not serve within {START_WAIT}s:\n{server.stderr}")

    def worker(
        self, name: str, *, crash_at: str | None = None, until_idle: bool = False
    ) -> Process:
        args = [sys.executable, "manage.py", "runtime_worker", "--worker-id", name]
        if until_idle:
            args.append("--until-idle")
        return self.spawn(name, args, **({"RUNTIME_CRASH_AT": crash_at} if crash_at else {}))

    def manage(self, *args: str) -> str:
        """Run ``manage.py <args>`` in the product's environment; return its stdout."""
        process = self.spawn(args[0], [sys.executable, "manage.py", *args])
        code = process.wait()
        assert code == 0, f"manage.py {' '.join(args)} exited {code}:\n{process.stderr}"
        return process.stdout

    def ledger(self) -> list[dict[str, Any]]:
        return json.loads(self.manage("demo_ledger", "--json"))

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def report(self) -> None:
        """Print each process's output tail (pytest shows it when the test failed)."""
        for process in self.processes:
            print(f"== {' '.join(process.args)} (exit {process.popen.returncode})")
            print(process.stdout[-1500:], process.stderr[-3000:], sep="\n")


def operator_credentials(server: Process) -> tuple[str, str]:
    """The first operator's account, as ``scripts/start`` printed it on its first run."""
    out = server.stdout
    user = re.search(r"Created operator '([^']+)'", out)
    password = re.search(r"Password \(shown once\): (\S+)", out)
    assert user and password, f"scripts/start printed no credentials:\n{out}"
    return user.group(1), password.group(1)


# -- watching: the run document and the live event stream --------------------------------------


def wait_for(
    read: Callable[[], dict[str, Any]],
    ok: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = WAIT,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = read()
        if ok(doc):
            return doc
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out waiting for {what}; last run document:\n"
                f"{json.dumps(doc, indent=1)[:4000]}"
            )
        time.sleep(0.1)


class LiveEvents:
    """``GET /api/v1/runs/{id}/events?live=1`` read on a thread until its ``end`` event."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.events: list[Event] = []
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, name="live-events", daemon=True)
        self.thread.start()
        assert self.connected.wait(WAIT), f"the event stream did not open: {self.error!r}"

    def _lines(self, response: httpx.Response) -> Iterator[str]:
        for line in response.iter_lines():
            if line.startswith("retry:"):
                self.connected.set()  # sent after the stream joined the run's live group
            yield line

    def _read(self) -> None:
        try:
            with httpx.stream(
                "GET",
                self.url,
                params={"live": "1"},
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=httpx.Timeout(10, read=WAIT),
            ) as response:
                response.raise_for_status()
                for event in parse(self._lines(response)):
                    self.events.append(event)
                    if event.event == "end":
                        return
        except BaseException as exc:
            self.error = exc
        finally:
            self.connected.set()

    def finish(self) -> list[Event]:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the event stream did not end"
        assert self.error is None, f"the event stream failed: {self.error!r}"
        return self.events


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def conversation() -> Iterator[Conversation]:
    server = Conversation()
    with server:
        yield server
    assert server.errors == [], "the replay server itself failed"


@pytest.fixture
def product_factory(
    tmp_path: Path, conversation: Conversation
) -> Iterator[Callable[[str | None], Product]]:
    made: list[Product] = []

    def make(redis: str | None) -> Product:
        made.append(Product(tmp_path / "product", f"{conversation.origin}/v1", redis))
        return made[-1]

    yield make
    for product in made:
        product.stop()
        product.report()


# -- the test -----------------------------------------------------------------------------------


VARIANTS = ["uninterrupted", "killed_mid_stream", "killed_after_executing"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_main_job_on_real_input(
    variant: str, request: pytest.FixtureRequest, product_factory, conversation: Conversation
) -> None:
    crashes = variant != "uninterrupted"
    product = product_factory(request.getfixturevalue("redis_url") if crashes else None)
    # The README's own command; with --no-worker the worker runs as separate processes.
    server = product.start(*(["--no-worker"] if crashes else []))
    username, password = operator_credentials(server)
    token = product.manage("runtime_token", username).strip()
    api = httpx.Client(
        base_url=product.url + "/api/v1",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    request.addfinalizer(api.close)

    def run_doc() -> dict[str, Any]:
        response = api.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def crashed(worker: Any, point: str) -> None:
        assert worker.wait() == 137, worker.stderr[-3000:]
        assert f"RUNTIME_CRASH_AT: crashing at {point}" in worker.stderr

    # -- start the run; the model's tool call is committed and gated -----------------------------
    started = api.post("/runs", json={"agent": "calculator", "input": QUESTION})
    assert started.status_code == 201, started.text
    run_id = started.json()["id"]

    if variant == "killed_mid_stream":
        crashed(product.worker("first", crash_at="inference_streaming:1"), "inference_streaming:1")
        second = product.worker("second", crash_at="inference_streaming:2")
    elif variant == "killed_after_executing":
        first = product.worker("first", crash_at="executing_committed")

    awaiting = wait_for(run_doc, lambda d: d["state"] == "awaiting", "the approval ticket")
    assert awaiting["end_cause"] is None
    [batch] = awaiting["batches"]
    [call] = batch["calls"]
    assert batch["finalized"] is False
    assert call["name"] == "multiply"
    assert call["arguments"] == {"a": 1231, "b": 2331}
    assert call["arguments_text"] == '{"a":1231,"b":2331}'  # as the model streamed it
    assert call["tool_call_id"] == CALL_ID
    assert (call["phase"], call["attempt"]) == ("awaiting", 0)
    assert (call["policy"], call["permission"]) == ("replay", "ask")
    ticket = awaiting["ticket"]
    assert ticket["kind"] == "approval" and ticket["call_id"] == call["call_id"]
    assert ticket["request"] == {
        "tool": "multiply",
        "arguments": {"a": 1231, "b": 2331},
        "operation_id": call["operation_id"],
    }
    assert [m["role"] for m in awaiting["messages"]] == ["user", "assistant"]
    assert awaiting["messages"][0]["content"] == QUESTION
    assert product.ledger() == [], "nothing may run before the approval"

    # -- watch live, approve through the API -----------------------------------------------------
    live = LiveEvents(f"{product.url}/api/v1/runs/{run_id}/events", token)
    approved = api.post(
        f"/runs/{run_id}/resume",
        json={"ticket_id": ticket["id"], "kind": "approval", "decision": "approve"},
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["ticket"] is None

    if variant == "killed_mid_stream":
        crashed(second, "inference_streaming:2")  # in the middle of the final answer
        last = product.worker("third", until_idle=True)
    elif variant == "killed_after_executing":
        crashed(first, "executing_committed")
        frozen = run_doc()["batches"][0]["calls"][0]
        assert (frozen["phase"], frozen["attempt"]) == ("executing", 1)
        assert product.ledger() == [], "the worker died before the effect"
        last = product.worker("second", until_idle=True)

    events = live.finish()
    ended = wait_for(run_doc, lambda d: d["state"] == "ended", "the end of the run")
    if crashes:
        assert last.wait() == 0, last.stderr[-3000:]

    # -- the committed outcome -------------------------------------------------------------------
    assert ended["end_cause"] == "natural", ended.get("error")
    [batch] = ended["batches"]
    [call] = batch["calls"]
    assert batch["finalized"] is True
    assert (call["phase"], call["result"], call["is_error"]) == ("completed", RESULT, False)
    assert call["attempt"] == (2 if variant == "killed_after_executing" else 1)
    messages = [(m["role"], m["content"], m.get("tool_call_id")) for m in ended["messages"]]
    assert messages == [
        ("user", QUESTION, None),
        ("assistant", "", None),
        ("tool", RESULT, CALL_ID),
        ("assistant", FINAL_TEXT, None),
    ]
    assert ended["messages"][1]["tool_calls"] == [
        {"id": CALL_ID, "name": "multiply", "arguments": '{"a":1231,"b":2331}'}
    ]

    # Executed exactly once, under the call's operation id.
    assert product.ledger() == [
        {
            "operation_id": call["operation_id"],
            "key": "1231*2331",
            "tool": "multiply",
            "run_id": run_id,
            "applied": 1,
        }
    ]

    # -- what the model was sent -----------------------------------------------------------------
    expected_turns = {
        "uninterrupted": ["tool", "text"],
        "killed_mid_stream": ["tool", "tool", "text", "text"],  # each stream asked again
        "killed_after_executing": ["tool", "text"],
    }[variant]
    assert conversation.turns() == expected_turns
    seen = conversation.seen
    assert all(s.path == "/v1/chat/completions" for s in seen)
    first_turn = [s.body for s in seen if "tool" not in [m["role"] for m in s.body["messages"]]]
    second_turn = [s.body for s in seen if s.body not in first_turn]
    assert all(body == TOOL_TURN["request"]["body"] for body in first_turn)  # byte for byte
    assert all(body == second_turn[0] for body in second_turn)  # a retry is the same request
    assert normalised(second_turn[0]) == normalised(TEXT_TURN["request"]["body"])

    # -- the live stream: the answer ahead of its commit, unconfirmed, then committed ------------
    commits = [e for e in events if e.event == "commit"]
    deltas = [e for e in events if e.event == "delta"]
    assert events[-1].event == "end"
    assert events[-1].data["state"] == "ended"
    assert all(e.data["confirmed"] is True and e.id == e.data["seq"] for e in commits)
    assert [e.id for e in commits] == list(range(1, ended["version"] + 1))  # no gap, no repeat
    assert all(e.data["confirmed"] is False and e.id is None for e in deltas)
    published = [
        n
        for n, e in enumerate(events)
        if e.event == "commit"
        and any(m["role"] == "tool" and m["content"] == RESULT for m in e.data["messages"])
    ]
    answered = [
        n
        for n, e in enumerate(events)
        if e.event == "commit"
        and any(m["role"] == "assistant" and m["content"] == FINAL_TEXT for m in e.data["messages"])
    ]
    assert len(published) == 1 and len(answered) == 1
    assert events[answered[0]].data["disposition"]["state"] == "ended"
    final_step = max(e.data["step"] for e in deltas)
    streamed = [
        n for n, e in enumerate(events) if e.event == "delta" and e.data["step"] == final_step
    ]
    assert streamed, "no live delta of the final answer"
    assert published[0] < streamed[0] and streamed[-1] < answered[0]
    assert all(events[n].data["kind"] == "text" for n in streamed)
    text = "".join(events[n].data["text"] for n in streamed)
    if variant == "killed_mid_stream":
        # What the killed attempt published before it died (its first token, unless the worker
        # died before its live send left the process), then the whole retried stream.
        partial = text[: len(text) - len(FINAL_TEXT)]
        assert text.endswith(FINAL_TEXT) and FINAL_TEXT.startswith(partial), text
    else:
        assert text == FINAL_TEXT

    # -- the console shows it --------------------------------------------------------------------
    with httpx.Client(base_url=product.url, timeout=10) as browser:
        form = browser.get("/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert csrf, form.text
        signed_in = browser.post(
            "/login/",
            data={"csrfmiddlewaretoken": csrf.group(1), "username": username, "password": password},
        )
        assert signed_in.status_code == 302 and signed_in.headers["location"] == "/", signed_in.text
        page = browser.get(f"/runs/{run_id}/")
        assert page.status_code == 200
        shown = html.unescape(page.text)
        assert FINAL_TEXT in shown
        assert re.search(r'data-testid="run-state">\s*ended · natural', shown), shown
        assert RESULT in shown and "multiply" in shown

    # -- the log folds into exactly the projections ----------------------------------------------
    product.manage("runtime_fsck")
