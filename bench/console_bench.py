"""Console benchmark (issue 5): page render time, query counts and live delta latency at scale.

    .venv/bin/python bench/console_bench.py           # seed (skipped if seeded), then measure
    .venv/bin/python bench/console_bench.py --reseed  # drop, re-create, migrate, seed again
    .venv/bin/python bench/console_bench.py --requests 100 --deltas 500 --skip-live

Needs PostgreSQL (``--database-url``, default postgres://postgres@127.0.0.1:5432/
runtime_console_bench: created when missing, always migrated) and, for the live part, Redis
(``--redis-url``, default redis://127.0.0.1:6379/5) and the ``websockets`` package.

Target (issue 5): with 100,000 runs and 1,000,000 commits, the runs page and a run page each
render in under 100 ms at the median server-side with a bounded number of queries, and a live
delta reaches the browser in under 50 ms at the median.

- **Seed** (set-based SQL: ``generate_series`` and ``INSERT ... SELECT``, one transaction):
  100,000 threads with one run each and exactly 1,000,000 ThreadCommit rows (10 per run on
  average; 100 runs of ~200 commits and 5 of ~1,000), with their projections: ToolCallRecord
  (one call per step; completed, requested, executing, awaiting and indeterminate ones),
  Ticket (consumed, void and open ones), MessageRecord (unpacked from the commits' messages),
  ReconciliationRecord (with their thread-note commits) and ``Run.snapshot`` (a RunView that
  ``codec.load_run`` reads; checked on a sample after seeding, like the commits' events and
  dispositions). The seed is plausible, not folded: ``runtime_fsck`` is not expected to pass.
  A row in ``bench_console_seed`` marks a finished seed; ``--reseed`` starts over.
- **Pages**: Django's test Client, in process, signed in as an operator: the runs page (first
  page, the second page by cursor, a state filter, a state + cause filter, an id-prefix
  search) and run pages (a typical run of ~10 commits, a run of ~200 commits, an awaiting run
  with an open ticket, a reconciled run, and a run of ~1,000 commits beyond the target). Each
  URL is warmed up, then timed ``--requests`` times (wall time of ``client.get``: URL
  resolution, middleware, session and user, view, queries, template); queries are counted
  in one more request with ``CaptureQueriesContext``, which also sums their database time.
- **HTTP**: the same pages over TCP through daphne (a real session cookie), client-observed;
  this adds ASGI, the socket and a new database connection per request (CONN_MAX_AGE=0).
- **Live**: daphne serves ``console.asgi`` with the Redis channel layer; a ``websockets``
  client signs in through the login form and opens ``/ws/runs/<run id>/``; a separate
  process (as a worker would) calls ``runtime.live.publish_delta`` ``--deltas`` times, every
  ``--interval`` seconds, with ``time.time_ns()`` in the text; latency is receive time minus
  that stamp (one machine, one clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/runtime_console_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/5"
RUNS = 100_000
COMMITS = 1_000_000
HEAVY = {i: 200 for i in range(500, RUNS + 1, 1000)} | {i: 1000 for i in range(7000, RUNS, 20000)}


def scale(runs: int) -> None:
    """Seed ``runs`` runs instead (10 commits each on average; ``--runs``, e.g. 5,000 for
    the console's triage target of issue 11: about 7 % of them await a ticket)."""
    global RUNS, COMMITS, HEAVY
    RUNS, COMMITS = runs, runs * 10
    HEAVY = {i: 200 for i in range(500, RUNS + 1, 1000)} | {
        i: 1000 for i in range(7000, RUNS, 20000)
    }


SEED = 20261130
USERNAME, PASSWORD = "bench-operator", "bench-operator-password"
TARGET_PAGE_MS, TARGET_LIVE_MS = 100.0, 50.0

# (state, end cause, weight in %)
MIX = [
    ("running", None, 3),
    ("awaiting", None, 7),
    ("ended", "natural", 70),
    ("ended", "failed", 8),
    ("ended", "cancelled", 6),
    ("ended", "indeterminate", 3),
    ("ended", "step_limit", 2),
    ("ended", "stopped", 1),
]
# The residue (body commits mod 3) a run's state needs: 0 = its last call completed,
# 1 = the last call only opened (requested / awaiting), 2 = the last call started executing.
RESIDUE = {"awaiting": 1, "natural": 0, "step_limit": 0, "indeterminate": 2}


# -- the scratch database --------------------------------------------------------------------


def ensure_database(url: str, *, reseed: bool) -> None:
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(url)
    name = config["NAME"]
    with psycopg.connect(
        dbname="postgres",
        host=config.get("HOST") or None,
        port=config.get("PORT") or None,
        user=config.get("USER") or None,
        password=config.get("PASSWORD") or None,
        autocommit=True,
    ) as db:
        if reseed:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        exists = db.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            db.execute(f'CREATE DATABASE "{name}"')


# -- the seed ----------------------------------------------------------------------------------


def plan_runs() -> list[tuple]:
    """One row per run: (i, agent, state, cause, n, rec, term, m, ncalls, partial, last_kind).

    n = commits on the run's thread (exactly COMMITS in all); rec = 1 when the last of them is
    a reconciliation note (run_id NULL); term = 1 when the run's last commit is a terminal one
    (Awaiting or Ended); m = body commits, three per tool call (opened, executing, completed);
    partial = m % 3 tells how far the last call got.
    """
    rng = random.Random(SEED)
    states = [(s, c) for s, c, w in MIX for _ in range(w)]
    rows: list[dict[str, Any]] = []
    for i in range(1, RUNS + 1):
        state, cause = rng.choice(states)
        rec = int(cause == "indeterminate" and rng.random() < 0.5)
        term = int(state != "running")
        n0 = HEAVY.get(i) or max(3, round(rng.lognormvariate(2.05, 0.55)))
        need = RESIDUE.get(cause or state)
        m = max(n0 - 1 - term - rec, need or 0)
        while need is not None and m % 3 != need:
            m += 1
        rows.append(
            {
                "i": i,
                "agent": "demo" if rng.random() < 0.7 else "assistant",
                "state": state,
                "cause": cause,
                "rec": rec,
                "term": term,
                "m": m,
                "need": need,
                "kind": ("approval" if rng.random() < 0.67 else "input")
                if state == "awaiting"
                else None,
            }
        )

    def total() -> int:
        return sum(r["m"] + 1 + r["term"] + r["rec"] for r in rows)

    normal = [r for r in rows if r["i"] not in HEAVY]
    free = [r for r in normal if r["need"] is None]
    diff = COMMITS - total()
    while abs(diff) >= 3:  # steps of 3 keep every run's residue
        r = rng.choice(normal)
        if diff > 0:
            r["m"] += 3
            diff -= 3
        elif r["m"] >= 3 + (r["need"] or 0):
            r["m"] -= 3
            diff += 3
    while diff:
        r = rng.choice(free)
        if diff > 0:
            r["m"] += 1
            diff -= 1
        elif r["m"] >= 1:
            r["m"] -= 1
            diff += 1
    assert total() == COMMITS
    out = []
    for r in rows:
        m = r["m"]
        n = m + 1 + r["term"] + r["rec"]
        ncalls = (m + 2) // 3
        out.append(
            (
                r["i"],
                r["agent"],
                r["state"],
                r["cause"],
                n,
                r["rec"],
                r["term"],
                m,
                ncalls,
                m % 3,
                r["kind"],
            )
        )
    return out


TOOLS = """
CREATE TEMP TABLE seed_tool (t int PRIMARY KEY, name text, policy text, permission text,
                             max_attempts int);
INSERT INTO seed_tool VALUES
  (0, 'ledger_replay', 'replay', 'allow', 3),
  (1, 'ledger_reconnect', 'reconnect', 'allow', 2),
  (2, 'ledger_once', 'indeterminate', 'allow', 1),
  (3, 'ledger_approval', 'indeterminate', 'ask', 1),
  (4, 'ask_input', 'indeterminate', 'allow', 1);
"""

INPUT_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "account": {"type": "string", "minLength": 1},
            "amount": {"type": "number", "minimum": 0},
        },
        "required": ["account", "amount"],
    }
)

# Every statement reads the plan (seed_plan) and the calls (seed_call, built first).
SEED_SQL = [
    (
        "plan ids and times",
        """
        ALTER TABLE seed_plan ADD COLUMN rid text, ADD COLUMN tid text,
          ADD COLUMN created timestamptz, ADD COLUMN nr int;
        UPDATE seed_plan SET rid = md5('run:' || i), tid = md5('thread:' || i),
          created = now() - interval '10 minutes' - (%(runs)s - i) * interval '26 seconds',
          nr = n - rec;
        ALTER TABLE seed_plan ADD PRIMARY KEY (i);
        ANALYZE seed_plan;
        """,
    ),
    (
        "calls (temp)",
        """
        CREATE TEMP TABLE seed_call AS
        SELECT x.*,
          CASE WHEN x.kind IS NULL THEN NULL
               WHEN x.state = 'running' AND x.is_last AND x.partial = 1 THEN NULL
               ELSE md5('ticket:' || x.i || ':' || x.c) END AS ticket_id,
          CASE WHEN x.state = 'awaiting' AND x.is_last THEN 'open'
               WHEN NOT x.is_last OR x.partial = 0 OR x.state = 'running' THEN 'consumed'
               ELSE 'void' END AS ticket_state,
          CASE WHEN NOT x.is_last OR x.partial = 0 THEN 'completed'
               WHEN x.state = 'running' AND x.partial = 1 THEN 'requested'
               WHEN x.state = 'running' THEN 'executing'
               WHEN x.state = 'awaiting' THEN 'awaiting'
               ELSE 'indeterminate' END AS phase,
          (x.is_last AND x.partial = 2 AND x.state = 'ended') AS effect,
          (NOT x.is_last OR x.partial = 0 OR x.state = 'ended') AS finalized,
          (NOT x.is_last OR x.partial = 0) AND (x.i + x.c) %% 17 = 0 AS is_error
        FROM (
          SELECT p.i, p.rid, p.tid, p.state, p.cause, p.partial, c, c + 1 AS step,
            md5('call:' || p.i || ':' || c) AS cid,
            'toolu_' || left(md5('tool_use:' || p.i || ':' || c), 24) AS tcid,
            (c = p.ncalls - 1 AND p.partial > 0) AS is_last,
            t.name, t.policy, t.permission, t.max_attempts,
            CASE WHEN t.name = 'ledger_approval' THEN 'approval'
                 WHEN t.name = 'ask_input' THEN 'input' END AS kind,
            CASE WHEN t.name = 'ask_input' THEN jsonb_build_object(
                   'question', 'Which account should be charged for invoice-' || p.i || '?',
                   'answer_schema', %(schema)s::jsonb)
                 ELSE jsonb_build_object('key', 'invoice-' || p.i || '-' || c) END AS args,
            p.created + (c * 3 + 4) * interval '1.5 seconds' AS updated
          FROM seed_plan p
          CROSS JOIN LATERAL generate_series(0, p.ncalls - 1) AS c
          JOIN seed_tool t ON t.t = CASE
            WHEN p.state = 'awaiting' AND c = p.ncalls - 1 AND p.last_kind = 'input' THEN 4
            WHEN p.state = 'awaiting' AND c = p.ncalls - 1 THEN 3
            ELSE (p.i + c) %% 4 END
        ) x;
        ALTER TABLE seed_call ADD COLUMN result text, ADD COLUMN call_json jsonb,
          ADD COLUMN attempt int;
        UPDATE seed_call SET
          attempt = CASE WHEN phase IN ('requested', 'awaiting')
                           OR (phase = 'indeterminate' AND NOT effect) THEN 0 ELSE 1 END,
          result = CASE
            WHEN phase <> 'completed' THEN NULL
            WHEN is_error THEN 'ledger unavailable: timeout after 30s (operation op_' || cid || ')'
            WHEN kind = 'input' THEN '{"account": "ACME-' || i || '", "amount": 12.5}'
            ELSE '{"applied": true, "key": "invoice-' || i || '-' || c
                 || '", "operation_id": "op_' || cid || '"}' END,
          call_json = jsonb_build_object(
            'call_id', cid, 'index', 0, 'tool_call_id', tcid, 'name', name,
            'arguments', args, 'arguments_text', args::text, 'operation_id', 'op_' || cid,
            'policy', policy, 'permission', permission, 'max_attempts', max_attempts,
            'phase', 'requested', 'attempt', 0, 'ticket_id', NULL, 'approved', false,
            'result', NULL, 'is_error', false, 'effect_may_have_started', false);
        CREATE UNIQUE INDEX ON seed_call (i, c);
        ANALYZE seed_call;
        """,
    ),
    (
        "threads",
        """
        INSERT INTO runtime_thread (id, created_at, version, active_run_id, metadata)
        SELECT tid, created, n, CASE WHEN state <> 'ended' THEN rid END,
               jsonb_build_object('source', 'console_bench')
        FROM seed_plan;
        """,
    ),
    (
        "tool calls",
        """
        INSERT INTO runtime_toolcallrecord (id, run_id, step, index, tool_call_id, name,
          arguments, arguments_text, operation_id, policy, permission, max_attempts, phase,
          attempt, approved, ticket_id, result, is_error, effect_may_have_started,
          batch_finalized, updated_at)
        SELECT cid, rid, step, 0, tcid, name, args, args::text, 'op_' || cid, policy,
          permission, max_attempts, phase, attempt, false, ticket_id, result, is_error, effect,
          finalized, updated
        FROM seed_call;
        """,
    ),
    (
        "tickets",
        """
        INSERT INTO runtime_ticket (id, run_id, call_id, kind, request, schema, state,
          created_at, opened_seq, closed_seq, closed_at, closed_by, decision)
        SELECT s.ticket_id, s.rid, s.cid, s.kind,
          CASE WHEN s.kind = 'input' THEN jsonb_build_object('question', s.args->'question')
               ELSE jsonb_build_object('tool', s.name, 'arguments', s.args,
                                       'operation_id', 'op_' || s.cid) END,
          CASE WHEN s.kind = 'input' THEN s.args->'answer_schema' END,
          s.ticket_state,
          p.created + (CASE WHEN s.ticket_state = 'open' THEN p.nr ELSE 2 + 3 * s.c END)
                      * interval '1.5 seconds',
          CASE WHEN s.ticket_state = 'open' THEN p.nr ELSE 2 + 3 * s.c END,
          CASE s.ticket_state WHEN 'consumed' THEN 3 + 3 * s.c WHEN 'void' THEN p.nr END,
          p.created + CASE s.ticket_state WHEN 'consumed' THEN 3 + 3 * s.c
                                          WHEN 'void' THEN p.nr END * interval '1.5 seconds',
          CASE s.ticket_state WHEN 'consumed' THEN 'abe' WHEN 'void' THEN 'olga' ELSE '' END,
          CASE WHEN s.ticket_state <> 'consumed' THEN ''
               WHEN s.kind = 'input' THEN 'input' ELSE 'approve' END
        FROM seed_call s JOIN seed_plan p ON p.i = s.i
        WHERE s.ticket_id IS NOT NULL;
        """,
    ),
    (
        "runs (with their RunView snapshot)",
        """
        CREATE TEMP TABLE seed_batches AS
        SELECT i, jsonb_agg(jsonb_build_object('step', step, 'finalized', finalized,
            'calls', jsonb_build_array(call_json || jsonb_build_object('phase', phase,
              'attempt', attempt, 'ticket_id', ticket_id, 'result', result,
              'is_error', is_error, 'effect_may_have_started', effect))) ORDER BY c) AS batches,
          COALESCE(jsonb_agg(ticket_id ORDER BY c) FILTER (WHERE ticket_state = 'consumed'
                                             AND ticket_id IS NOT NULL),
                   '[]'::jsonb) AS consumed
        FROM seed_call GROUP BY i;
        CREATE UNIQUE INDEX ON seed_batches (i);
        INSERT INTO runtime_run (id, thread_id, agent, state, end_cause, error, version, step,
          snapshot, metadata, created_by, created_at, committed_at, lease_owner,
          lease_expires_at, lease_epoch, claims)
        SELECT rid, tid, agent, state, cause, error, nr, step,
          jsonb_build_object('run_id', rid, 'thread_id', tid, 'agent', agent, 'state', state,
            'end_cause', cause, 'error', error, 'step', step,
            'batches', COALESCE(batches, '[]'::jsonb), 'ticket', ticket,
            'consumed_tickets', COALESCE(consumed, '[]'::jsonb), 'version', nr),
          '{}'::jsonb, CASE WHEN i %% 3 = 0 THEN 'abe' ELSE 'olga' END,
          created, created + nr * interval '1.5 seconds',
          CASE WHEN state = 'running' AND i %% 2 = 0 THEN 'bench-host:4242' END,
          CASE WHEN state = 'running' AND i %% 2 = 0 THEN now() + interval '15 seconds' END,
          CASE WHEN state = 'running' AND i %% 2 = 0 THEN 1 ELSE 0 END, 0
        FROM (
          SELECT p.*, b.batches, b.consumed,
            ncalls + CASE WHEN cause = 'natural' THEN 1 ELSE 0 END AS step,
            CASE WHEN cause = 'failed' THEN jsonb_build_object('code', 'model_error',
              'message', 'provider returned 500 after 4 retries') END AS error,
            (SELECT jsonb_build_object('id', t.id, 'run_id', t.run_id, 'call_id', t.call_id,
                'kind', t.kind, 'request', t.request, 'schema', t.schema)
             FROM runtime_ticket t WHERE t.run_id = p.rid AND t.state = 'open') AS ticket
          FROM seed_plan p LEFT JOIN seed_batches b ON b.i = p.i
        ) x;
        DROP TABLE seed_batches;
        """,
    ),
    (
        "commits: activations",
        """
        INSERT INTO runtime_threadcommit (thread_id, seq, run_id, disposition, messages,
          events, actor, created_at)
        SELECT tid, 1, rid,
          '{"state": "running", "ticket": null, "end_cause": null, "error": null}'::jsonb,
          jsonb_build_array(jsonb_build_object('role', 'user',
            'content', 'Record invoice-' || i || ' in the ledger, then confirm.',
            'tool_calls', '[]'::jsonb, 'tool_call_id', NULL, 'name', NULL, 'meta', '{}'::jsonb)),
          jsonb_build_array(jsonb_build_object('type', 'RunActivated', 'run_id', rid,
            'agent', agent, 'metadata', '{}'::jsonb)),
          CASE WHEN i %% 3 = 0 THEN 'abe' ELSE 'olga' END, created + interval '1.5 seconds'
        FROM seed_plan;
        """,
    ),
    (
        "commits: steps and tool calls",
        """
        INSERT INTO runtime_threadcommit (thread_id, seq, run_id, disposition, messages,
          events, actor, created_at)
        SELECT p.tid, j + 2, p.rid,
          '{"state": "running", "ticket": null, "end_cause": null, "error": null}'::jsonb,
          CASE j %% 3
            WHEN 0 THEN jsonb_build_array(jsonb_build_object('role', 'assistant',
              'content', 'I will call ' || s.name || ' for invoice-' || p.i || '-' || s.c || '.',
              'tool_calls', jsonb_build_array(jsonb_build_object('id', s.tcid,
                 'name', s.name, 'arguments', s.args::text)),
              'tool_call_id', NULL, 'name', NULL, 'meta', '{}'::jsonb))
            WHEN 1 THEN '[]'::jsonb
            ELSE jsonb_build_array(jsonb_build_object('role', 'tool', 'content', s.result,
              'tool_calls', '[]'::jsonb, 'tool_call_id', s.tcid, 'name', s.name,
              'meta', '{}'::jsonb)) END,
          CASE j %% 3
            WHEN 0 THEN jsonb_build_array(
              jsonb_build_object('type', 'StepCommitted', 'step', s.step),
              jsonb_build_object('type', 'BatchOpened', 'step', s.step,
                                 'calls', jsonb_build_array(s.call_json)))
            WHEN 1 THEN jsonb_build_array(jsonb_build_object('type', 'CallExecuting',
              'call_id', s.cid, 'attempt', 1, 'worker', 'bench-host:' || (4240 + p.i %% 4)))
            ELSE jsonb_build_array(
              jsonb_build_object('type', 'CallCompleted', 'call_id', s.cid,
                                 'result', s.result, 'is_error', s.is_error),
              jsonb_build_object('type', 'BatchFinalized', 'step', s.step)) END,
          'bench-host:' || (4240 + p.i %% 4),
          p.created + (j + 2) * interval '1.5 seconds'
        FROM seed_plan p
        CROSS JOIN LATERAL generate_series(0, p.m - 1) AS j
        JOIN seed_call s ON s.i = p.i AND s.c = j / 3;
        """,
    ),
    (
        "commits: terminal",
        """
        INSERT INTO runtime_threadcommit (thread_id, seq, run_id, disposition, messages,
          events, actor, created_at)
        SELECT p.tid, p.nr, p.rid,
          CASE WHEN p.state = 'awaiting' THEN jsonb_build_object('state', 'awaiting',
                 'ticket', jsonb_build_object('id', s.ticket_id, 'run_id', p.rid,
                   'call_id', s.cid, 'kind', s.kind, 'request', t.request, 'schema', t.schema),
                 'end_cause', NULL, 'error', NULL)
               ELSE jsonb_build_object('state', 'ended', 'ticket', NULL,
                 'end_cause', p.cause, 'error', r.error) END,
          CASE WHEN p.cause = 'natural' THEN jsonb_build_array(jsonb_build_object(
                 'role', 'assistant', 'content', 'Done: invoice-' || p.i
                 || ' is recorded in the ledger once.', 'tool_calls', '[]'::jsonb,
                 'tool_call_id', NULL, 'name', NULL, 'meta', '{}'::jsonb))
               ELSE '[]'::jsonb END,
          CASE WHEN p.state = 'awaiting' THEN jsonb_build_array(jsonb_build_object(
                 'type', 'CallAwaiting', 'call_id', s.cid, 'ticket_id', s.ticket_id))
               WHEN p.cause = 'natural' THEN jsonb_build_array(jsonb_build_object(
                 'type', 'StepCommitted', 'step', p.ncalls + 1))
               WHEN p.partial > 0 THEN jsonb_build_array(
                 jsonb_build_object('type', 'CallIndeterminate', 'call_id', s.cid,
                   'reason', CASE p.cause WHEN 'cancelled' THEN 'run cancelled'
                     WHEN 'indeterminate' THEN 'worker lost during the call'
                     ELSE 'run ended (' || p.cause || ')' END),
                 jsonb_build_object('type', 'BatchFinalized', 'step', p.ncalls))
               ELSE '[]'::jsonb END,
          CASE WHEN p.cause = 'cancelled' THEN 'olga' ELSE 'bench-host:' || (4240 + p.i %% 4) END,
          p.created + p.nr * interval '1.5 seconds'
        FROM seed_plan p
        JOIN runtime_run r ON r.id = p.rid
        LEFT JOIN seed_call s ON s.i = p.i AND s.c = p.ncalls - 1
        LEFT JOIN runtime_ticket t ON t.id = s.ticket_id
        WHERE p.term = 1;
        """,
    ),
    (
        "commits: reconciliation notes",
        """
        INSERT INTO runtime_threadcommit (thread_id, seq, run_id, disposition, messages,
          events, actor, created_at)
        SELECT p.tid, p.n, NULL, NULL, '[]'::jsonb,
          jsonb_build_array(jsonb_build_object('type', 'ReconciliationRecorded',
            'run_id', p.rid, 'call_id', s.cid, 'outcome', 'applied',
            'evidence', 'ledger shows op_' || s.cid || ' applied once')),
          'olga', p.created + p.n * interval '1.5 seconds' + interval '1 hour'
        FROM seed_plan p JOIN seed_call s ON s.i = p.i AND s.c = p.ncalls - 1
        WHERE p.rec = 1;
        INSERT INTO runtime_reconciliationrecord (thread_id, call_id, seq, outcome, evidence,
          actor, created_at)
        SELECT p.tid, s.cid, p.n, 'applied', 'ledger shows op_' || s.cid || ' applied once',
          'olga', p.created + p.n * interval '1.5 seconds' + interval '1 hour'
        FROM seed_plan p JOIN seed_call s ON s.i = p.i AND s.c = p.ncalls - 1
        WHERE p.rec = 1;
        """,
    ),
    (
        "messages (from the commits)",
        """
        INSERT INTO runtime_messagerecord (thread_id, run_id, seq, idx, role, content,
          tool_calls, tool_call_id, name, meta)
        SELECT c.thread_id, c.run_id, c.seq, m.ord - 1, m.value->>'role',
          m.value->>'content', m.value->'tool_calls', m.value->>'tool_call_id',
          m.value->>'name', m.value->'meta'
        FROM runtime_threadcommit c
        CROSS JOIN LATERAL jsonb_array_elements(c.messages) WITH ORDINALITY AS m(value, ord)
        WHERE c.run_id IS NOT NULL;
        """,
    ),
    (
        "analyze",
        """
        ANALYZE runtime_thread, runtime_run, runtime_toolcallrecord, runtime_ticket,
          runtime_threadcommit, runtime_messagerecord, runtime_reconciliationrecord;
        """,
    ),
]


def is_seeded() -> bool:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('bench_console_seed') IS NOT NULL")
        if not cur.fetchone()[0]:
            return False
        cur.execute("SELECT runs, commits FROM bench_console_seed")
        return cur.fetchone() == (RUNS, COMMITS)


def seed() -> None:
    from django.db import connection, transaction

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM runtime_run")
        if cur.fetchone()[0]:
            raise SystemExit(
                "the bench database has runs but no finished seed: run again with --reseed"
            )
    started = time.perf_counter()
    plan = plan_runs()
    print(f"seed: planned {len(plan):,} runs in {time.perf_counter() - started:.1f}s", flush=True)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL synchronous_commit = off")
        cur.execute(
            """CREATE TEMP TABLE seed_plan (i int, agent text, state text, cause text, n int,
                 rec int, term int, m int, ncalls int, partial int, last_kind text)
               ON COMMIT DROP"""
        )
        with cur.copy("COPY seed_plan FROM STDIN") as copy:
            for row in plan:
                copy.write_row(row)
        cur.execute(TOOLS)
        params: dict[str, int | str] = {"runs": RUNS, "schema": INPUT_SCHEMA}
        for label, sql in SEED_SQL:
            t0 = time.perf_counter()
            cur.execute(sql, params)
            print(f"seed: {label:<32} {time.perf_counter() - t0:6.1f}s", flush=True)
        cur.execute("DROP TABLE seed_call, seed_tool")
        cur.execute(
            "CREATE TABLE bench_console_seed (runs int, commits int, seeded_at timestamptz,"
            " seconds float)"
        )
        cur.execute(
            "INSERT INTO bench_console_seed VALUES (%s, %s, now(), %s)",
            [RUNS, COMMITS, time.perf_counter() - started],
        )
    t0 = time.perf_counter()
    with connection.cursor() as cur:  # as autovacuum would: hint bits, visibility map
        cur.execute(
            "VACUUM ANALYZE runtime_thread, runtime_run, runtime_toolcallrecord, runtime_ticket,"
            " runtime_threadcommit, runtime_messagerecord, runtime_reconciliationrecord"
        )
    print(f"seed: {'vacuum':<32} {time.perf_counter() - t0:6.1f}s", flush=True)
    print(f"seed: done in {time.perf_counter() - started:.1f}s", flush=True)


def check_seed() -> dict[str, int]:
    """Row counts, and the stored JSON read back through the codec on a sample."""
    from django.db import connection

    from runtime import codec
    from runtime.models import Run, ThreadCommit

    counts = {}
    with connection.cursor() as cur:
        for table in (
            "thread",
            "run",
            "threadcommit",
            "messagerecord",
            "toolcallrecord",
            "ticket",
            "reconciliationrecord",
        ):
            cur.execute(f"SELECT count(*) FROM runtime_{table}")
            counts[table] = cur.fetchone()[0]
    import hashlib

    rng = random.Random()
    picks = rng.sample(range(1, RUNS + 1), 300) + list(HEAVY)
    ids = {hashlib.md5(f"run:{i}".encode()).hexdigest() for i in picks}
    snapshots = list(Run.objects.filter(id__in=ids).values_list("snapshot", flat=True))
    assert len(snapshots) == len(ids)
    for snapshot in snapshots:
        view = codec.load_run(snapshot)
        assert view.version >= 1 and view.state.value in ("running", "awaiting", "ended")
    with connection.cursor() as cur:
        cur.execute("SELECT min(id), max(id) FROM runtime_threadcommit")
        low, high = cur.fetchone()
    for c in ThreadCommit.objects.filter(id__in=rng.sample(range(low, high + 1), 2000)):
        codec.load_disposition(c.disposition)
        for e in c.events:
            codec.load_event(e)
        for m in c.messages:
            codec.load_message(m)
    assert counts["threadcommit"] == COMMITS and counts["run"] == RUNS, counts
    return counts


# -- measuring ---------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def operator_user():
    from django.contrib.auth import get_user_model

    from console.management.groups import ensure_groups

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_password(PASSWORD)
    user.save()
    user.groups.add(ensure_groups()["operators"])
    return user


def pick_targets() -> tuple[dict[str, str], dict[str, str]]:
    """The URLs measured: runs-page variants and run pages of chosen shapes."""
    from django.db.models import F
    from django.test import Client

    from runtime.models import Run, ToolCallRecord

    def run_with(**filters) -> Run:
        run = Run.objects.filter(**filters).order_by("-created_at").first()
        assert run is not None, filters
        return run

    typical = run_with(state="ended", end_cause="natural", version__in=(10, 11))
    heavy = run_with(state="ended", end_cause="natural", version__gte=190, version__lte=210)
    awaiting = run_with(state="awaiting", version__gte=8, version__lte=12)
    reconciled = (
        Run.objects.filter(end_cause="indeterminate", thread__version__gt=F("version"))
        .order_by("-created_at")
        .first()
    )
    huge = Run.objects.filter(version__gte=900).order_by("-created_at").first()
    runs_pages = {
        "runs: first page": "/",
        "runs: state=awaiting": "/?state=awaiting",
        "runs: ended + failed": "/?state=ended&cause=failed",
        "runs: search (8-char id prefix)": f"/?q={typical.id[:8]}",
        "runs: search (2-char prefix, ~800 hits)": f"/?q={typical.id[:2]}",
    }
    client = Client()
    client.force_login(operator_user())
    html = client.get("/").content.decode()
    after = re.search(r'href="\?(after=[^"]+)"', html)
    if after:
        runs_pages["runs: page 2 (cursor)"] = "/?" + after.group(1).replace("&amp;", "&")
    runs_pages["runs: needs reconciliation"] = "/?unreconciled=on"
    runs_pages["runs: search by operation id"] = (
        "/?q="
        + (
            ToolCallRecord.objects.order_by("-updated_at").values_list("operation_id", flat=True)[
                0
            ][:12]
        )
    )
    runs_pages["inbox: first page"] = "/inbox/"
    inbox = client.get("/inbox/").content.decode()
    newer = re.search(r'href="\?([^"]*after=[^"]+)"', inbox)
    if newer:
        runs_pages["inbox: page 2 (cursor)"] = "/inbox/?" + newer.group(1).replace("&amp;", "&")
    runs_pages["inbox: kind=input"] = "/inbox/?kind=input"
    runs_pages["inbox: counter bar (live refresh)"] = "/inbox/?part=bar"
    runs_pages["audit: every decision"] = "/audit/"
    runs_pages["audit: decision=approve"] = "/audit/?decision=approve"
    runs_pages["reconcile: to check"] = "/reconcile/"
    run_pages = {
        f"run: typical ({typical.version} commits)": f"/runs/{typical.id}/",
        f"run: many commits ({heavy.version})": f"/runs/{heavy.id}/",
        f"run: awaiting, open ticket ({awaiting.version})": f"/runs/{awaiting.id}/",
    }
    if reconciled:
        run_pages[f"run: reconciled ({reconciled.version})"] = f"/runs/{reconciled.id}/"
    if huge:
        run_pages[f"run: {huge.version} commits (beyond target)"] = f"/runs/{huge.id}/"
    return runs_pages, run_pages


def measure_pages(pages: dict[str, str], requests: int) -> list[dict[str, Any]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(operator_user())
    results = []
    for label, url in pages.items():
        for _ in range(3):  # warm: templates, plans, caches
            assert client.get(url).status_code == 200, url
        times, cpu = [], []
        size = 0
        for _ in range(requests):
            c0, t0 = time.process_time(), time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            assert response.status_code == 200, (url, response.status_code)
            size = len(response.content)
        timed: list[tuple[float, str]] = []

        def clock(execute, sql, params, many, context, timed=timed):
            t0 = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                timed.append(((time.perf_counter() - t0) * 1000, sql))

        with CaptureQueriesContext(connection) as ctx, connection.execute_wrapper(clock):
            client.get(url)
        db_ms = sum(ms for ms, _ in timed)
        slowest_ms, slowest_sql = max(timed)
        results.append(
            {
                "label": label,
                "url": url,
                "median": statistics.median(times),
                "p95": pct(times, 95),
                "cpu": statistics.median(cpu),
                "queries": len(ctx.captured_queries),
                "db_ms": db_ms,
                "slowest_ms": slowest_ms,
                "slowest_sql": slowest_sql[:160],
                "kb": size / 1024,
            }
        )
        print(f"  {label:<44} median {results[-1]['median']:7.1f} ms", flush=True)
    return results


# -- daphne, HTTP and the live stream ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "console.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            assert proc.stderr is not None  # stderr=PIPE
            raise SystemExit(f"daphne exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("daphne did not start listening in 30 s")


def login(base: str):
    import httpx

    client = httpx.Client(base_url=base, follow_redirects=False, timeout=30)
    page = client.get("/login/")
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found is not None, "the login page has no CSRF token"
    token = found.group(1)
    answer = client.post(
        "/login/",
        data={"username": USERNAME, "password": PASSWORD, "csrfmiddlewaretoken": token},
    )
    assert answer.status_code == 302 and "sessionid" in client.cookies, answer.status_code
    return client


def measure_http(client, pages: dict[str, str], requests: int) -> list[dict[str, Any]]:
    results = []
    for label, url in pages.items():
        for _ in range(3):
            assert client.get(url).status_code == 200
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200
        results.append({"label": label, "median": statistics.median(times), "p95": pct(times, 95)})
    return results


async def live_latency(
    port: int, run_id: str, cookie: str, env: dict[str, str], count: int, interval: float
) -> dict[str, Any]:
    import websockets
    from websockets.typing import Origin

    uri = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/"
    async with websockets.connect(
        uri, origin=Origin(f"http://127.0.0.1:{port}"), additional_headers={"Cookie": cookie}
    ) as ws:
        hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert hello["event"] == "hello" and hello["run_id"] == run_id, hello
        publisher = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--publish",
            run_id,
            "--deltas",
            str(count),
            "--interval",
            str(interval),
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        latencies: list[float] = []
        warm = 0
        while len(latencies) < count:
            raw = await asyncio.wait_for(ws.recv(), 30)
            received = time.time_ns()
            message = json.loads(raw)
            if message.get("event") != "delta":
                continue
            if message["attempt"] == 0:  # the publisher's warm-up deltas
                warm += 1
                continue
            sent = int(message["text"].split(" ", 1)[0])
            latencies.append((received - sent) / 1e6)
        out, _ = await publisher.communicate()
    publish = json.loads(out.decode().strip().splitlines()[-1])
    return {
        "deltas": len(latencies),
        "median": statistics.median(latencies),
        "p95": pct(latencies, 95),
        "max": max(latencies),
        "publish_median": publish["median"],
        "publish_p95": publish["p95"],
    }


def publisher(run_id: str, count: int, interval: float) -> None:
    """The worker's side: publish_delta from plain synchronous code, as runtime.loop does."""
    import django

    django.setup()
    from runtime.live import publish_delta

    for k in range(5):  # warm-up: first connection to Redis, imports
        publish_delta(run_id, step=1, attempt=0, delta={"kind": "text", "text": f"warm {k}"})
        time.sleep(interval)
    calls = []
    for k in range(count):
        t0 = time.perf_counter()
        publish_delta(
            run_id,
            step=1,
            attempt=1,
            delta={"kind": "text", "text": f"{time.time_ns()} token {k} ", "index": 0},
        )
        calls.append((time.perf_counter() - t0) * 1000)
        time.sleep(interval)
    time.sleep(1)  # runtime.live may hand sends to a background loop: let it drain
    print(json.dumps({"median": statistics.median(calls), "p95": pct(calls, 95)}))


# -- the report --------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], http: dict[str, dict[str, Any]]) -> str:
    head = (
        f"{'page':<46} {'median':>8} {'p95':>8} {'cpu med':>7} {'queries':>7} {'db ms':>7} "
        f"{'KiB':>6} {'http med':>9} {'http p95':>9}  target"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        h = http.get(r["label"])
        hm = f"{h['median']:9.1f}" if h else f"{'-':>9}"
        hp = f"{h['p95']:9.1f}" if h else f"{'-':>9}"
        beyond = "beyond" in r["label"]
        ok = "n/a" if beyond else ("ok" if r["median"] < TARGET_PAGE_MS else "MISS")
        lines.append(
            f"{r['label']:<46} {r['median']:8.1f} {r['p95']:8.1f} {r['cpu']:7.1f} "
            f"{r['queries']:7d} {r['db_ms']:7.1f} {r['kb']:6.0f} {hm} {hp}  {ok}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("CONSOLE_BENCH_DATABASE_URL", DEFAULT_DB)
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("CONSOLE_BENCH_REDIS_URL", DEFAULT_REDIS)
    )
    parser.add_argument("--reseed", action="store_true", help="drop the database and seed again")
    parser.add_argument("--requests", type=int, default=60, help="timed requests per page")
    parser.add_argument("--deltas", type=int, default=300, help="live deltas to time")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between deltas")
    parser.add_argument("--skip-live", action="store_true", help="no daphne, HTTP or live part")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print EXPLAIN ANALYZE of the slowest query of each page",
    )
    parser.add_argument("--publish", metavar="RUN_ID", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=RUNS, help="runs to seed (commits: 10 per run)")
    args = parser.parse_args()
    scale(args.runs)

    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["REDIS_URL"] = args.redis_url
    if args.publish:
        publisher(args.publish, args.deltas, args.interval)
        return 0

    ensure_database(args.database_url, reseed=args.reseed)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    if is_seeded():
        print("seed: already seeded (use --reseed to start over)")
    else:
        seed()
    counts = check_seed()
    print("rows: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    runs_pages, run_pages = pick_targets()
    pages = runs_pages | run_pages
    print(f"pages ({args.requests} timed requests each, Django test Client, in process):")
    rows = measure_pages(pages, args.requests)

    if args.explain:
        explain(rows)

    http: dict[str, dict[str, Any]] = {}
    live = None
    if not args.skip_live:
        env = dict(os.environ)
        env.pop("DJANGO_DEBUG", None)
        daphne, port = start_daphne(env)
        try:
            client = login(f"http://127.0.0.1:{port}")
            print(f"http through daphne on port {port} ({args.requests} requests each)")
            http = {r["label"]: r for r in measure_http(client, pages, args.requests)}
            cookie = f"sessionid={client.cookies['sessionid']}"
            run_id = next(iter(run_pages.values())).strip("/").split("/")[-1]
            print(f"live: {args.deltas} deltas every {args.interval * 1000:.0f} ms to {run_id}")
            live = asyncio.run(live_latency(port, run_id, cookie, env, args.deltas, args.interval))
        finally:
            daphne.terminate()
            try:
                daphne.wait(10)
            except subprocess.TimeoutExpired:
                daphne.kill()

    print()
    print(
        f"PostgreSQL {args.database_url.rsplit('@', 1)[-1]}: {counts['run']:,} runs, "
        f"{counts['threadcommit']:,} commits, {counts['toolcallrecord']:,} calls, "
        f"{counts['messagerecord']:,} messages, {counts['ticket']:,} tickets"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        "median/p95: server-side wall ms (test Client, in process); cpu med: this process's CPU"
        " ms (no database); db ms: the queries of one request; http: client-observed through"
        f" daphne. {os.cpu_count()} CPUs, load average {load}"
    )
    print(table(rows, http))
    by_queries: dict[int, list[str]] = {}
    for r in rows:
        if r["label"].startswith("run:") and "beyond" not in r["label"]:
            by_queries.setdefault(r["queries"], []).append(r["label"])
    print(f"run page query counts: {dict(sorted(by_queries.items()))}")
    if live:
        verdict = "ok" if live["median"] < TARGET_LIVE_MS else "MISS"
        print(
            f"live delta, worker -> browser: median {live['median']:.2f} ms, p95 "
            f"{live['p95']:.2f} ms, max {live['max']:.2f} ms over {live['deltas']} deltas "
            f"({verdict}); publish_delta call itself: median {live['publish_median']:.2f} ms, "
            f"p95 {live['publish_p95']:.2f} ms"
        )
    return 0


def explain(rows: list[dict[str, Any]]) -> None:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(operator_user())
    for r in rows:
        with CaptureQueriesContext(connection) as ctx:
            client.get(r["url"])
        slowest = sorted(ctx.captured_queries, key=lambda q: -float(q["time"]))[:2]
        for q in slowest:
            print(f"\n== {r['label']}: {float(q['time']) * 1000:.1f} ms\n{q['sql'][:400]}")
            with connection.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
                print("\n".join(row[0] for row in cur.fetchall()))


if __name__ == "__main__":
    sys.exit(main())
