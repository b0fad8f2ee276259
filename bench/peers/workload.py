"""The demo workload, shared by the peers: a scripted model, the ledger, timing and reporting.

The workload is the one ``bench/loop_bench.py`` drives through our runtime: a user message,
one model Step answering three ledger tool calls (ledger_once "a", ledger_reconnect "b",
ledger_replay "c"), the three calls one after another, then a text-only Step that ends the run.
The model is scripted (no network). Each tool call writes one ledger row keyed by its operation
id, in a table of the same shape as the demo agent's ``runtime_ledgereffect`` (an upsert that
counts repeated applications in ``applied``), on the same PostgreSQL database.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg

PROMPT = "Record a, b and c."
CALLS = (("ledger_once", "a"), ("ledger_reconnect", "b"), ("ledger_replay", "c"))
FINAL_TEXT = "All three keys are recorded."
# A busy backend publishes its statistics (its session's start among them) at most once a
# second; an idle one up to 10 s late (PostgreSQL's PGSTAT_IDLE_INTERVAL). compare.py's
# --settle sets this for itself and the peers.
SETTLE_ENV = "BENCH_STATS_SETTLE_SECONDS"

Batch = Callable[[int], list[str]]  # runs ``count`` runs, returns their run ids


def scripted_reply(step: int) -> dict[str, Any]:
    """The scripted model's answer to inference number ``step`` (0-based).

    Returns ``{"text": str, "tool_calls": [{"id", "name", "arguments": {"key"}}]}``: the three
    ledger calls at step 0, the final text after.
    """
    if step == 0:
        calls = [
            {"id": f"call_{i}", "name": name, "arguments": {"key": key}}
            for i, (name, key) in enumerate(CALLS)
        ]
        return {"text": "", "tool_calls": calls}
    return {"text": FINAL_TEXT, "tool_calls": []}


def database_url() -> str:
    """DATABASE_URL as a libpq URL (``postgresql://...``); SystemExit when it is not PostgreSQL."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("the peers need DATABASE_URL pointing at PostgreSQL")
    return "postgresql://" + url.split("://", 1)[1]


class Ledger:
    """A ledger table of the demo agent's shape, written through a pool of ``size`` connections.

    ``apply`` is the demo tools' effect: insert the row of an operation id, or count one more
    application when it exists. ``check`` raises SystemExit unless every given run has exactly
    three rows applied once.
    """

    def __init__(self, table: str, size: int) -> None:
        # psycopg_pool comes with the bench extra; compare.py imports this module without it.
        from psycopg_pool import ConnectionPool

        self.table = table
        self.pool = ConnectionPool(
            database_url(), min_size=size, max_size=size, kwargs={"autocommit": True}, open=True
        )
        self.pool.wait()
        with self.pool.connection() as db:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                " id bigserial PRIMARY KEY,"
                " operation_id varchar(100) NOT NULL UNIQUE,"
                " key varchar(200) NOT NULL,"
                " tool varchar(100) NOT NULL,"
                " run_id varchar(64) NOT NULL,"
                " applied integer NOT NULL DEFAULT 1 CHECK (applied >= 0),"
                " created_at timestamptz NOT NULL DEFAULT now())"
            )
            db.execute(f"CREATE INDEX IF NOT EXISTS {table}_run ON {table} (run_id)")

    def apply(self, operation_id: str, key: str, tool: str, run_id: str) -> dict[str, str]:
        """Record ``key`` once per ``operation_id``; return the tool's JSON result."""
        with self.pool.connection() as db:
            db.execute(
                f"INSERT INTO {self.table} (operation_id, key, tool, run_id)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (operation_id)"
                f" DO UPDATE SET applied = {self.table}.applied + 1",
                (operation_id, key, tool, run_id),
            )
        return {"recorded": key, "operation_id": operation_id}

    def check(self, run_ids: list[str]) -> None:
        with self.pool.connection() as db:
            found = db.execute(
                f"SELECT count(*), min(applied), max(applied) FROM {self.table}"
                " WHERE run_id = ANY(%s)",
                (run_ids,),
            ).fetchone()
        assert found is not None  # an aggregate always has its one row
        rows, low, high = found
        if (rows, low, high) != (len(CALLS) * len(run_ids), 1, 1):
            raise SystemExit(
                f"wrong outcome in {self.table}: {rows} rows for {len(run_ids)} runs, "
                f"applied between {low} and {high}"
            )

    def close(self) -> None:
        self.pool.close()


@contextmanager
def server_counters() -> Iterator[Callable[[], dict[str, int]]]:
    """Yield a function returning what the server counted on this database since entry:
    ``{"sessions": new sessions, "transactions": committed and rolled back transactions}``.

    Reads ``pg_stat_database`` (sessions: PostgreSQL 14+) through one connection held for the
    whole block, so its own session is not in the delta (its own reads are: a few
    transactions). Each read waits ``$BENCH_STATS_SETTLE_SECONDS`` first (default 1.2 s): other
    backends publish their counters late, so a session opened before the block by a backend
    that has stayed idle since may still land in the delta unless the wait is over 10 s.
    """
    settle = float(os.environ.get(SETTLE_ENV, "1.2"))
    with psycopg.connect(database_url(), autocommit=True) as db:

        def read() -> dict[str, int]:
            time.sleep(settle)
            db.execute("SELECT pg_stat_clear_snapshot()")
            row = db.execute(
                "SELECT sessions, xact_commit + xact_rollback FROM pg_stat_database"
                " WHERE datname = current_database()"
            ).fetchone()
            assert row is not None  # every database has its row
            sessions, transactions = row
            return {"sessions": int(sessions), "transactions": int(transactions)}

        start = read()
        yield lambda: {name: value - start[name] for name, value in read().items()}


def threaded(run_one: Callable[[], str], threads: int) -> Batch:
    """A Batch that runs ``run_one`` ``count`` times on ``threads`` threads."""

    def batch(count: int) -> list[str]:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(lambda _: run_one(), range(count)))

    return batch


def measure(batch: Batch, ledger: Ledger, runs: int, warmup: int) -> dict[str, float]:
    """Run ``warmup`` untimed runs, then ``runs`` timed ones; check the ledger of both.

    Returns ``{"runs": int, "seconds": wall seconds of the timed runs, "runs_per_second",
    "sessions_per_run": new PostgreSQL sessions during the timed runs / runs,
    "transactions_per_run": PostgreSQL transactions of every session / runs}``.
    """
    ledger.check(batch(warmup))
    with server_counters() as counted:
        began = time.perf_counter()
        run_ids = batch(runs)
        seconds = time.perf_counter() - began
        counts = counted()
    ledger.check(run_ids)
    return {
        "runs": runs,
        "seconds": seconds,
        "runs_per_second": runs / seconds,
        "sessions_per_run": counts["sessions"] / runs,
        "transactions_per_run": counts["transactions"] / runs,
    }


def parser(description: str) -> argparse.ArgumentParser:
    """The options every peer takes: --runs, --threads, --warmup."""
    options = argparse.ArgumentParser(description=description)
    options.add_argument("--runs", type=int, default=100, help="timed runs")
    options.add_argument("--threads", type=int, default=1, help="threads running workflows")
    options.add_argument("--warmup", type=int, default=8, help="untimed runs first")
    return options


def report(result: dict[str, Any]) -> None:
    """Print the result as one JSON line on stdout (what compare.py reads)."""
    print(json.dumps(result), flush=True)
