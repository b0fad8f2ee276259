"""SIGKILL chaos: 3 workers killed at random while approvals and cancels arrive by the API.

    .venv/bin/python tests/chaos/chaos.py --seconds 600 \\
        [--database-url postgres://postgres@127.0.0.1:5432/runtime_chaos]

By hand it uses its own PostgreSQL database (created when missing, migrated, flushed: every
row in it is the chaos run's). ``tests/chaos/test_chaos.py`` runs the short form on the
test database. For ``--seconds``:

- 3 ``runtime_worker`` processes (``--max-inflight 2``, 1 s leases) drive the runs; a killer
  SIGKILLs one at random every 1 to 3 seconds and starts a replacement;
- a starter keeps ``--in-flight`` runs of the demo agent going through the API, each with a
  random script of ledger tools (``ledger_once``, ``ledger_approval``, ``ledger_reconnect``,
  ``ledger_replay``), ``slow`` and streamed text;
- an operator answers open approval tickets (approve, sometimes deny, sometimes twice with
  one Idempotency-Key) and cancels a random run now and then, through the API;
- a reader fetches run documents through the API and compares each with the fold of the log
  at the document's version (tests/torn.py).

Then the kills stop, the operator approves what still waits, and every run must end. The
report counts, and each must be 0: duplicates beyond policy (a ``ledger_once``,
``ledger_approval`` or ``ledger_reconnect`` effect applied more than once), lost commits
(fsck violations, and acknowledged starts, approvals or cancels the log does not show), stuck
runs (not ended in the end), poisoned healthy runs (ended ``indeterminate``: every script is
healthy) and torn reads. The exit status is 1 when any is not 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKERS = 3
ONCE_POLICY_TOOLS = ("ledger_once", "ledger_approval", "ledger_reconnect")
WORKER_ENV = {
    "RUNTIME_LEASE_SECONDS": "1",
    "RUNTIME_HEARTBEAT_SECONDS": "0.3",
    "RUNTIME_IDLE_POLL_SECONDS": "0.05",
    "RUNTIME_MODEL_BACKOFF_SECONDS": "0.01",
    "RUNTIME_LOG_LEVEL": "WARNING",
    "PYTHONUNBUFFERED": "1",
}


@dataclass
class Report:
    seconds: float = 0.0
    kills: int = 0
    runs: int = 0
    reads: int = 0
    approvals: int = 0
    cancels: int = 0
    duplicates_beyond_policy: int = 0
    lost_commits: int = 0
    stuck_runs: int = 0
    poisoned_healthy_runs: int = 0
    torn_reads: int = 0
    details: dict[str, list[str]] = field(default_factory=dict)

    def failures(self) -> dict[str, int]:
        counts = {
            "duplicates_beyond_policy": self.duplicates_beyond_policy,
            "lost_commits": self.lost_commits,
            "stuck_runs": self.stuck_runs,
            "poisoned_healthy_runs": self.poisoned_healthy_runs,
            "torn_reads": self.torn_reads,
        }
        return {k: v for k, v in counts.items() if v}


def random_script(rng: random.Random, tag: str) -> dict[str, Any]:
    """A healthy script: 1-3 batches of 1-3 tool calls (unique keys), streamed text, an end."""
    steps: list[dict[str, Any]] = []
    for step in range(rng.randint(1, 3)):
        calls = []
        for index in range(rng.randint(1, 3)):
            name = rng.choice(
                ["ledger_once", "ledger_replay", "ledger_reconnect", "ledger_approval", "slow"]
            )
            arguments = {"seconds": 0.3} if name == "slow" else {"key": f"{tag}-{step}-{index}"}
            calls.append({"name": name, "arguments": arguments})
        steps.append({"text": "working " * 8, "chunks": 4, "delay_ms": 20, "tool_calls": calls})
    steps.append({"text": "done " * 10, "chunks": 5, "delay_ms": 20})
    return {"steps": steps}


class Chaos:
    """One chaos run against ``base_url`` (an API server) on the database of this process."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        env: dict[str, str],
        seconds: float,
        in_flight: int = 8,
        settle_seconds: float = 120,
        seed: int | None = None,
        log_dir: Path,
    ) -> None:
        self.api = httpx.Client(
            base_url=base_url + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        self.env = {**env, **WORKER_ENV}
        self.seconds, self.in_flight, self.settle_seconds = seconds, in_flight, settle_seconds
        self.rng = random.Random(seed)
        self.log_dir = log_dir
        self.report = Report()
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.approved: list[str] = []  # ticket ids acknowledged (200)
        self.cancelled: list[str] = []  # run ids acknowledged (200)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.stop = threading.Event()
        self.spawned = 0

    # -- processes ------------------------------------------------------------------------

    def spawn_worker(self) -> subprocess.Popen[bytes]:
        self.spawned += 1
        command = [sys.executable, "manage.py", "runtime_worker", "--max-inflight", "2"]
        command += ["--worker-id", f"chaos-{self.spawned}"]
        with (self.log_dir / f"worker-{self.spawned}.log").open("wb") as log:
            return subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def killer(self) -> None:
        while not self.stop.wait(self.rng.uniform(1.0, 3.0)):
            slot = self.rng.randrange(len(self.workers))
            victim = self.workers[slot]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.workers[slot] = self.spawn_worker()
            with self.lock:
                self.report.kills += 1

    # -- API clients ----------------------------------------------------------------------

    def active_runs(self) -> list[str]:
        with self.lock:
            started = list(self.started)
        return started

    def starter(self) -> None:
        while not self.stop.is_set():
            page = self.api.get("/runs", params={"state": "running", "limit": 200}).json()
            awaiting = self.api.get("/runs", params={"state": "awaiting", "limit": 200}).json()
            if len(page["items"]) + len(awaiting["items"]) < self.in_flight:
                tag = uuid.uuid4().hex[:8]
                body = {
                    "agent": "demo",
                    "input": "go",
                    "metadata": {"script": random_script(self.rng, tag)},
                }
                response = self.api.post("/runs", json=body)
                if response.status_code == 201:
                    with self.lock:
                        self.started.append(response.json()["id"])
            self.stop.wait(0.2)

    def answer(self, ticket: dict[str, Any]) -> None:
        run_id = ticket["run_id"]
        decision = "deny" if self.rng.random() < 0.15 else "approve"
        body = {"ticket_id": ticket["id"], "kind": "approval", "decision": decision}
        key = uuid.uuid4().hex if self.rng.random() < 0.3 else None
        headers = {"Idempotency-Key": key} if key else {}
        for _ in range(2 if key else 1):  # a keyed answer is sent twice: one effect
            response = self.api.post(f"/runs/{run_id}/resume", json=body, headers=headers)
            if response.status_code == 200:
                with self.lock:
                    self.approved.append(ticket["id"])
                    self.report.approvals += 1

    def operator(self, cancel_every: float = 8.0) -> None:
        next_cancel = time.monotonic() + cancel_every
        while not self.stop.is_set():
            tickets = self.api.get("/tickets", params={"state": "open", "limit": 50}).json()
            for ticket in tickets["items"]:
                if ticket["kind"] == "approval":
                    self.answer(ticket)
            if time.monotonic() >= next_cancel and (runs := self.active_runs()):
                run_id = self.rng.choice(runs[-self.in_flight * 2 :])
                response = self.api.post(f"/runs/{run_id}/cancel", json={"reason": "chaos"})
                if response.status_code == 200:
                    with self.lock:
                        self.cancelled.append(run_id)
                        self.report.cancels += 1
                next_cancel = time.monotonic() + cancel_every
            self.stop.wait(0.3)

    def reader(self) -> None:
        from django.db import connection

        from tests.torn import torn

        try:
            while not self.stop.is_set():
                runs = self.active_runs()
                if not runs:
                    self.stop.wait(0.1)
                    continue
                response = self.api.get(f"/runs/{self.rng.choice(runs[-20:])}")
                if response.status_code != 200:
                    continue
                problem = torn(response.json())
                with self.lock:
                    self.report.reads += 1
                    if problem is not None:
                        self.report.torn_reads += 1
                        self.report.details.setdefault("torn", []).append(problem[:500])
        finally:
            connection.close()

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        began = time.monotonic()
        self.workers = [self.spawn_worker() for _ in range(WORKERS)]
        threads = [
            threading.Thread(target=target, name=target.__name__, daemon=True)
            for target in (self.killer, self.starter, self.operator, self.reader)
        ]
        try:
            for thread in threads:
                thread.start()
            self.stop.wait(self.seconds)
            self.stop.set()
            for thread in threads:
                thread.join(60)
            self.settle()
        finally:
            self.stop.set()
            for worker in self.workers:
                worker.terminate()
            for worker in self.workers:
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            self.api.close()
        self.report.seconds = round(time.monotonic() - began, 1)
        self.count()
        return self.report

    def settle(self) -> None:
        """No more kills: approve what waits until every run has ended (or time is up)."""
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline:
            tickets = self.api.get("/tickets", params={"state": "open", "limit": 50}).json()
            for ticket in tickets["items"]:
                self.answer(ticket)
            running = self.api.get("/runs", params={"state": "running", "limit": 1}).json()
            if not tickets["items"] and not running["items"]:
                awaiting = self.api.get("/runs", params={"state": "awaiting", "limit": 1})
                if not awaiting.json()["items"]:
                    return
            time.sleep(0.3)

    def count(self) -> None:
        from runtime.demo.models import LedgerEffect
        from runtime.fsck import check
        from runtime.models import Run, ThreadCommit, Ticket

        report, details = self.report, self.report.details
        report.runs = len(self.started)
        twice = LedgerEffect.objects.filter(tool__in=ONCE_POLICY_TOOLS, applied__gt=1)
        report.duplicates_beyond_policy = twice.count()
        details["duplicates"] = [f"{e.tool} {e.operation_id} x{e.applied}" for e in twice[:20]]
        violations = check()
        lost = [str(v) for v in violations]
        known_runs = set(Run.objects.filter(id__in=self.started).values_list("id", flat=True))
        lost += [f"started run {r} missing" for r in self.started if r not in known_runs]
        consumed = set(
            Ticket.objects.filter(id__in=self.approved)
            .exclude(state="open")
            .values_list("id", flat=True)
        )
        lost += [
            f"acknowledged answer to ticket {t} not committed"
            for t in set(self.approved) - consumed
        ]
        ended = set(
            Run.objects.filter(id__in=self.cancelled, state="ended").values_list("id", flat=True)
        )
        lost += [f"acknowledged cancel of {r} not committed" for r in set(self.cancelled) - ended]
        report.lost_commits = len(lost)
        details["lost"] = lost[:20]
        stuck = Run.objects.filter(id__in=self.started).exclude(state="ended")
        report.stuck_runs = stuck.count()
        details["stuck"] = [f"{r.id} {r.state}" for r in stuck[:20]]
        poisoned = Run.objects.filter(id__in=self.started, end_cause="indeterminate")
        report.poisoned_healthy_runs = poisoned.count()
        details["poisoned"] = [f"{r.id} {r.error}" for r in poisoned[:20]]
        details["commits"] = [str(ThreadCommit.objects.count())]


# -- by hand ----------------------------------------------------------------------------------


def _prepare_database(url: str) -> None:
    """Create the chaos database when missing, then migrate and flush it."""
    import psycopg

    name = url.rsplit("/", 1)[-1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
            conn.execute(f'create database "{name}"')
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/runtime_chaos"
    )
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        parser.error("chaos needs PostgreSQL (several workers write at once)")
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    _prepare_database(args.database_url)
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from console.models import ApiToken
    from tests.servers import serving

    user = get_user_model().objects.create_user("chaos")
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="console"))
    _, token = ApiToken.issue(user, name="chaos")
    log_dir = ROOT / "var" / "chaos"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **WORKER_ENV}
    with serving(env, log_dir / "server.log") as base_url:
        report = Chaos(
            base_url=base_url,
            token=token,
            env=env,
            seconds=args.seconds,
            in_flight=args.in_flight,
            seed=args.seed,
            log_dir=log_dir,
        ).run()
    print(json.dumps(asdict(report), indent=2))
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
