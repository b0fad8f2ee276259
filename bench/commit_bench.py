"""ThreadCommit throughput and latency through ``runtime.coordinator.commit``, against a floor.

The workload is a Run's text-only Steps: each commit carries StepCommitted, one assistant
message and a Running disposition. The coordinator path builds the CommitDraft a worker would
build and calls ``commit``. The floor writes the same rows with a raw cursor, one transaction
per commit: the head move (conditional UPDATE of the thread), the run projection UPDATE (with
the same snapshot JSON), the ThreadCommit INSERT and the MessageRecord INSERT. Each is run with
one writer, then with N concurrent writers (Python threads, each with its own connection and
its own Thread row). Target: coordinator <= 2x the floor per commit on PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x python bench/commit_bench.py
    python bench/commit_bench.py --commits 1000 --writers 4 --profile      # SQLite (default)

It works on a scratch database it creates and migrates itself: ``runtime_bench`` on the
PostgreSQL server of DATABASE_URL (dropped and re-created), or ``bench.sqlite3`` under
RUNTIME_VAR_DIR (default var/) for SQLite. ``--profile`` lists one commit's queries and splits
its time between the database and the Python work of validation and encoding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
SCRATCH_PG = "runtime_bench"


# -- the scratch database, before Django is set up ---------------------------------------------


def scratch_database() -> str:
    """Point DATABASE_URL at a fresh scratch database; return a label for the report."""
    import dj_database_url

    url = os.environ.get("DATABASE_URL", "")
    if url and not url.startswith("sqlite"):
        import psycopg

        config = dj_database_url.parse(url)
        # The maintenance database: the one in the URL may not exist (pytest-django uses test_*).
        with psycopg.connect(
            dbname="postgres",
            host=config.get("HOST") or None,
            port=config.get("PORT") or None,
            user=config.get("USER") or None,
            password=config.get("PASSWORD") or None,
            autocommit=True,
        ) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{SCRATCH_PG}" WITH (FORCE)')
            db.execute(f'CREATE DATABASE "{SCRATCH_PG}"')
        base = url.rsplit("/", 1)[0]
        os.environ["DATABASE_URL"] = f"{base}/{SCRATCH_PG}"
        return f"postgresql ({SCRATCH_PG} on {config['HOST']}:{config['PORT']})"
    var = Path(os.environ.get("RUNTIME_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    path = var / "bench.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    return f"sqlite ({path})"


# -- the two write paths ---------------------------------------------------------------------


class Writer(Protocol):
    def write(self) -> None: ...


class CoordinatorWriter:
    """A worker's view of one run: it commits Steps through the coordinator and keeps the
    committed state it gets back (no re-read between commits, as the loop does)."""

    def __init__(self) -> None:
        from runtime.coordinator import commit, read_head
        from runtime.domain.commit import CommitDraft
        from runtime.domain.events import RunActivated
        from runtime.domain.model import Disposition, Message
        from runtime.models import Thread

        thread_id = Thread.objects.create().id
        run_id = uuid.uuid4().hex
        done = commit(
            CommitDraft(
                thread_id=thread_id,
                run_id=run_id,
                expected_version=read_head(thread_id).version,
                disposition=Disposition.running(),
                messages=(Message(role="user", content="benchmark"),),
                events=(RunActivated(run_id=run_id, agent="demo"),),
            )
        )
        assert done.run is not None
        self.head, self.run = done.head, done.run

    def draft(self):
        from runtime.domain.commit import CommitDraft
        from runtime.domain.events import StepCommitted
        from runtime.domain.model import Disposition, Message

        assert self.run is not None
        step = self.run.step + 1
        return CommitDraft(
            thread_id=self.head.thread_id,
            run_id=self.run.run_id,
            expected_version=self.head.version,
            disposition=Disposition.running(),
            messages=(Message(role="assistant", content=f"step {step} " + "x" * 200),),
            events=(StepCommitted(step=step),),
        )

    def write(self) -> None:
        from runtime.coordinator import commit

        done = commit(self.draft(), head=self.head, before=self.run)
        assert done.run is not None
        self.head, self.run = done.head, done.run


class FloorWriter:
    """The same rows as a coordinator Step commit, written with a raw cursor in one
    transaction: UPDATE thread (conditional), UPDATE run, INSERT commit, INSERT message."""

    def __init__(self) -> None:
        from django.db import connection

        from runtime import codec
        from runtime.models import MessageRecord, Run, Thread, ThreadCommit

        seed = CoordinatorWriter()  # the same starting rows, written the ordinary way
        self.thread_id, self.run_id = seed.head.thread_id, seed.run.run_id
        self.version, self.step = seed.head.version, 0
        self.snapshot = codec.dump_run(seed.run)
        cast = "::jsonb" if connection.vendor == "postgresql" else ""
        t, r = Thread._meta.db_table, Run._meta.db_table
        c, m = ThreadCommit._meta.db_table, MessageRecord._meta.db_table
        self.sql = (
            f"UPDATE {t} SET version = %s, active_run_id = %s WHERE id = %s AND version = %s",
            f"UPDATE {r} SET state = %s, end_cause = NULL, error = NULL, version = %s, "
            f"step = %s, snapshot = %s{cast}, committed_at = %s, claims = 0 WHERE id = %s",
            f"INSERT INTO {c} (thread_id, seq, run_id, disposition, messages, events, actor, "
            f"created_at) VALUES (%s, %s, %s, %s{cast}, %s{cast}, %s{cast}, '', %s)",
            f"INSERT INTO {m} (thread_id, run_id, seq, idx, role, content, tool_calls, "
            f"tool_call_id, name, meta) VALUES (%s, %s, %s, 0, 'assistant', %s, "
            f"'[]'{cast}, NULL, NULL, '{{}}'{cast})",
        )

    def write(self) -> None:
        from django.db import connection, transaction
        from django.utils import timezone

        seq, step = self.version + 1, self.step + 1
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        content = f"step {step} " + "x" * 200
        snapshot = {**self.snapshot, "step": step, "version": seq}
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "tool_calls": [],
            "tool_call_id": None,
            "name": None,
            "meta": {},
        }
        disposition = {"state": "running", "ticket": None, "end_cause": None, "error": None}
        events = [{"type": "StepCommitted", "step": step}]
        head, run, log, msg = self.sql
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(head, [seq, self.run_id, self.thread_id, self.version])
            if cursor.rowcount != 1:
                raise RuntimeError("the floor lost its head")
            cursor.execute(run, ["running", seq, step, json.dumps(snapshot), now, self.run_id])
            cursor.execute(
                log,
                [
                    self.thread_id,
                    seq,
                    self.run_id,
                    json.dumps(disposition),
                    json.dumps([message]),
                    json.dumps(events),
                    now,
                ],
            )
            cursor.execute(msg, [self.thread_id, self.run_id, seq, content])
        self.version, self.step = seq, step


# -- measuring -------------------------------------------------------------------------------


WARMUP = 20
LIVE_UID = "runtime.live.forward"  # runtime.apps connects the live fan-out under this uid


def _live_forward(signal):
    """The receiver connected under LIVE_UID (connected with weak=False), or None."""
    for entry in signal.receivers:
        if entry[0][0] == LIVE_UID:
            return entry[1]
    return None


def measure(make: Callable[[], Writer], writers: int, commits: int) -> dict[str, float]:
    """Run ``writers`` writers at once, ``commits`` timed commits each; return the figures."""
    from django.db import connection

    barrier = threading.Barrier(writers + 1)
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            writer = make()
            for _ in range(WARMUP):
                writer.write()
            barrier.wait()
            own = latencies[i]
            for _ in range(commits):
                start = time.perf_counter()
                writer.write()
                own.append(time.perf_counter() - start)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    every = sorted(x for own in latencies for x in own)
    return {
        "commits": len(every),
        "per_second": len(every) / wall,
        "median_ms": statistics.median(every) * 1000,
        "p99_ms": every[min(len(every) - 1, int(len(every) * 0.99))] * 1000,
    }


def profile(commits: int = 300) -> None:
    """Coordinator Step commits: their queries with the mean time of each, and where the
    rest of a commit's time goes (measured with the live fan-out receiver connected)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runtime import codec
    from runtime.domain.commit import apply_commit

    writer = CoordinatorWriter()
    for _ in range(WARMUP):
        writer.write()
    with CaptureQueriesContext(connection) as queries:
        writer.write()
    statements = [" ".join(q["sql"].split()) for q in queries.captured_queries]

    spent: dict[int, float] = {}
    position = [0]

    def timed(execute, sql, params, many, context):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            i = position[0]
            spent[i] = spent.get(i, 0.0) + time.perf_counter() - start
            position[0] += 1

    # COMMIT and the on_commit announcement do not pass through execute_wrapper: time them
    # by wrapping the connection's _commit and the coordinator's _announce.
    from django.db import connections

    from runtime import coordinator

    wrapper = connections["default"]
    extra = {"COMMIT": 0.0, "on_commit announcement (live fan-out)": 0.0}

    def clock(name, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                extra[name] += time.perf_counter() - start

        return run

    total = 0.0
    real_commit, real_announce = wrapper._commit, coordinator._announce  # type: ignore[attr-defined]
    wrapper._commit = clock("COMMIT", real_commit)  # type: ignore[attr-defined]
    coordinator._announce = clock("on_commit announcement (live fan-out)", real_announce)
    try:
        with connection.execute_wrapper(timed):
            for _ in range(commits):
                position[0] = 0
                start = time.perf_counter()
                writer.write()
                total += time.perf_counter() - start
    finally:
        del wrapper._commit  # type: ignore[attr-defined]
        coordinator._announce = real_announce

    print(
        f"\none coordinator Step commit: {len(statements)} statements "
        f"(mean of {commits} commits, live fan-out on)"
    )
    wrapped = [
        s for s in statements if not s.startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"))
    ]
    for i, sql in enumerate(wrapped):
        print(f"  {spent.get(i, 0.0) / commits * 1000:7.3f} ms  {sql[:110]}")
    for name, seconds in extra.items():
        print(f"  {seconds / commits * 1000:7.3f} ms  {name}")
    accounted = sum(spent.values()) + sum(extra.values())
    print(
        f"  {(total - accounted) / commits * 1000:7.3f} ms  the rest: ORM query building, "
        "validation, encoding (Python)"
    )
    print(
        f"  {total / commits * 1000:7.3f} ms  total per commit (a statement's time is its driver "
        "call and round trip; the first one carries the implicit BEGIN)"
    )

    n = 500
    draft = writer.draft()
    snapshot = codec.dump_run(writer.run)
    timings = {
        "read_run decode (codec.load_run)": lambda: codec.load_run(snapshot),
        "apply_commit (validation)": lambda: apply_commit(writer.head, writer.run, draft),
        "snapshot encode (codec.dump_run)": lambda: codec.dump_run(writer.run),
        "log row encode (events, messages)": lambda: (
            codec.dump_disposition(draft.disposition),
            [codec.dump_message(m) for m in draft.messages],
            [codec.dump_event(e) for e in draft.events],
        ),
    }
    from runtime import live
    from runtime.signals import CommitNotice

    notice = CommitNotice(
        thread_id=writer.head.thread_id,
        run_id=writer.run.run_id,
        seq=0,
        state="running",
        runnable=False,
    )
    timings["live.publish_commit (on_commit)"] = lambda: live.publish_commit(notice)
    print(f"python work per commit (mean of {n}, no database):")
    for name, fn in timings.items():
        start = time.perf_counter()
        for _ in range(n):
            fn()
        print(f"  {name:36} {(time.perf_counter() - start) / n * 1e6:8.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=500, help="timed commits per writer")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writers")
    parser.add_argument("--profile", action="store_true", help="list one commit's queries")
    parser.add_argument(
        "--no-sync",
        action="store_true",
        help="PostgreSQL: synchronous_commit=off for every connection of both paths, so the "
        "WAL flush does not hide the per-commit overhead (not a production setting)",
    )
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # One INFO line per commit on stderr would time the terminal; set it to INFO to include it.
    os.environ.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
    label = scratch_database()

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    if args.no_sync:
        from django.db.backends.signals import connection_created

        def no_sync(sender, connection, **kwargs):
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SET synchronous_commit = off")

        connection_created.connect(no_sync, weak=False)
        label += ", synchronous_commit=off"
    from django.db import connection

    connection.close()

    from runtime.signals import commit_announced

    rows = []
    for writers in (1, args.writers):
        for name, make in (
            ("coordinator", CoordinatorWriter),
            ("coord. no live", CoordinatorWriter),
            ("floor (raw SQL)", FloorWriter),
        ):
            # "no live": without the live fan-out receiver (runtime.apps) that commit() runs
            # in its on_commit announcement, after the transaction, on the writer's thread.
            quiet = name == "coord. no live"
            if quiet:
                receiver = _live_forward(commit_announced)
                commit_announced.disconnect(dispatch_uid=LIVE_UID)
            try:
                rows.append((name, writers, measure(make, writers, args.commits)))
            finally:
                if quiet and receiver is not None:
                    commit_announced.connect(receiver, weak=False, dispatch_uid=LIVE_UID)

    print(f"\ndatabase: {label}; Step commits (1 assistant message), {args.commits} per writer")
    print(
        f"{'path':16} {'writers':>7} {'commits':>8} {'commits/s':>10} {'median ms':>10} "
        f"{'p99 ms':>8}"
    )
    for name, writers, r in rows:
        print(
            f"{name:16} {writers:>7} {r['commits']:>8} {r['per_second']:>10.0f} "
            f"{r['median_ms']:>10.3f} {r['p99_ms']:>8.3f}"
        )
    print("\nratio to the floor (median latency, p99, time per commit = 1/throughput):")
    for i in range(0, len(rows), 3):
        fl = rows[i + 2][2]
        for name, writers, co in rows[i : i + 2]:
            print(
                f"  {name:16} {writers} writer(s): {co['median_ms'] / fl['median_ms']:5.2f}x "
                f"{co['p99_ms'] / fl['p99_ms']:5.2f}x {fl['per_second'] / co['per_second']:5.2f}x"
            )
    if args.profile:
        profile()
    connection.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
