"""A year of history (issue 28): every operator and integration read against N runs.

    .venv/bin/python bench/history.py --runs 10000 100000           # build, then measure
    .venv/bin/python bench/history.py --runs 100000 --build         # build only
    .venv/bin/python bench/history.py --runs 100000 --measure       # measure a built database

PostgreSQL only. Each size gets its own database, ``<--database-prefix>_<N>`` on the server of
``--database-url`` (default postgres://postgres@127.0.0.1:5432/, prefix ``hist_bench``), so a
built database is reused by later ``--measure`` runs (before and after a change).

**Build** (dropped and re-created, migrated):

1. *Template*: real runs of the scripted ``demo`` agent driven by ``manage.py runtime_worker
   --until-idle`` subprocesses: plain runs, approvals (approved, denied, left open), inputs
   (answered, left open), a timer left open, delegations (a child run each), fatal model
   failures, step limits, cancels, a pause, forks, and ``ledger_once`` calls crash-injected
   (``RUNTIME_CRASH_AT=executing_committed``) so that the next worker finds them Indeterminate
   (some then reconciled). About 100 runs (``--template-scale`` multiplies the mix).
2. *Multiplication*: every table of the runtime's that has a ``run_id`` or ``thread_id``
   (and ``runtime_thread``) is copied ``C`` times in one ``INSERT ... SELECT`` per table over
   ``generate_series(1, C)``, with foreign-key triggers off (``session_replication_role =
   replica``). Every 32-hex id, wherever it stands (id columns, JSON documents, ``op_<hex>``
   operation ids), gets copy ``g``'s first 8 hex digits (a bijection of ``g``, so ids of all
   copies stay unique and look random) and keeps its last 24: consistent across tables. The
   ids the product derives by a hash are derived again from the copy's inputs instead, as the
   product would have: a fork's copies of its source's ids (``fork.copied_id`` of the fork's
   run id and the old id) and a child run's id (``delegation.child_run_id`` of its delegate
   call's operation id). Every timestamp of copy ``g`` moves ``g / C x 90`` days into the
   past, the columns and the UTC times written inside JSON documents (a timer's ``due_at``, a
   pause's ``paused_at``) alike. Serial ids are re-issued; the run counts
   (``runtime_runcount``, kept by triggers the copy bypasses) are counted again. Then
   ``ANALYZE``; then
   ``runtime.fsck.check`` in process on every thread of the template, of ``--fsck-copies``
   whole copies (every kind of thread: forks, delegations, timers, approvals) and of
   ``--fsck-sample`` random threads, reported clean/unclean by kind.

**Measure**: daphne serves ``console.asgi:application`` on loopback (no worker); httpx, signed
in (a session cookie for the console, a Bearer token for the API), times each read
``--requests`` times after one warm-up (p50/p95, client-observed ms). Then each read once more
in process (Django's test client) with ``connection.execute_wrapper`` timing every statement:
the ``EXPLAIN (ANALYZE, BUFFERS)`` of each statement over ``--slow-ms`` (default 50) is
printed. Commands (``runtime_export``, ``runtime_fsck --thread``, ``runtime_prune --dry-run``)
are timed as subprocesses; the claim in process (``runtime.worker.claim``, nothing runnable:
a worker's idle poll). Last, bytes per run by table (``pg_total_relation_size`` / runs).

The table is printed as Markdown, one column per size; ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/"
USERNAME = "history-bench"
DAYS = 90
# A 32-hex id anywhere in a text (not inside a longer hex string): its first 8 digits are the
# copy's, its last 24 the template's.
ID_RX = r"(?<![0-9a-f])[0-9a-f]{8}([0-9a-f]{24})(?![0-9a-f])"
# A time the product writes inside a JSON document (``datetime.isoformat()`` of a UTC time: a
# timer's ``due_at``, a pause's ``paused_at``): it moves with the copy's timestamp columns.
TIME_RX = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{6})?\+00:00"
# What a copy rewrites one by one in the few rows that need it (``hist_text``).
TOKEN_RX = rf"(?<![0-9a-f])[0-9a-f]{{32}}(?![0-9a-f])|{TIME_RX}"
KNUTH = 2654435761  # copy g's 8 hex digits: (g * KNUTH) mod 2**32, a bijection of g
COMMON_WORD = "invoice"
ABSENT_WORD = "qqxyzzyabsent"


def url_for(base: str, name: str) -> str:
    return base.rstrip("/").rsplit("/", 1)[0] + "/" + name if base.count("/") > 2 else base + name


def environment(database_url: str) -> dict[str, str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="console.settings", PYTHONUNBUFFERED="1")
    env["DATABASE_URL"] = database_url
    env.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
    env.pop("REDIS_URL", None)
    return env


def manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def admin_connect(database_url: str):
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(database_url)
    return psycopg.connect(
        dbname="postgres",
        host=config.get("HOST") or None,
        port=config.get("PORT") or None,
        user=config.get("USER") or None,
        password=config.get("PASSWORD") or None,
        autocommit=True,
    )


def note(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def setup_django(database_url: str) -> None:
    os.environ.update(environment(database_url))
    import django

    django.setup()


# -- the template: real runs through the worker --------------------------------------------


def script(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"script": {"steps": list(steps)}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def text(words: str) -> dict[str, Any]:
    return {"text": words}


def template_mix() -> list[tuple[str, dict[str, Any]]]:
    """(kind, metadata) of one round of template runs; the kind names what happens next."""
    child = {"steps": [call("ledger_replay", key="child"), text("child done")]}
    return [
        ("natural", script(call("ledger_replay", key="a"), text(f"{COMMON_WORD} recorded"))),
        ("natural", script(call("ledger_reconnect", key="b"), text("recorded"))),
        ("natural", script(text("nothing to record"))),
        ("two_steps", script(call("ledger_replay", key="c"), call("ledger_replay", key="d"))),
        ("approve", script(call("ledger_approval", key="e"), text("approved and recorded"))),
        ("deny", script(call("ledger_approval", key="f"), text("denied"))),
        ("approval_open", script(call("ledger_approval", key="g"), text("never"))),
        (
            "answer",
            script(
                call("ask_input", question="which?", answer_schema={"type": "string"}),
                text("thanks"),
            ),
        ),
        (
            "input_open",
            script(
                call("ask_input", question="amount?", answer_schema={"type": "integer"}),
                text("never"),
            ),
        ),
        ("timer_open", script(call("wait", seconds=86_400), text("never"))),
        (
            "delegate",
            script(
                call("delegate", input="do the child part", script=child), text("child answered")
            ),
        ),
        ("failed", script({"error": "fatal", "times": 1})),
        ("step_limit", script(*[call("ledger_replay", key=f"s{i}") for i in range(9)])),
        ("cancel", script(call("ledger_approval", key="h"), text("never"))),
        ("pause", script(call("ledger_approval", key="i"), text("after pause"))),
        (
            "fork",
            script(
                call("ledger_replay", key="j"),
                call("ledger_replay", key="k"),
                text("forked source"),
            ),
        ),
    ]


def build_template(env: dict[str, str], scale: int) -> dict[str, int]:
    """Drive the template runs through real workers; return counts of what was done."""
    from runtime import operations
    from runtime.domain.model import Decision, ResumeCommand, TicketKind
    from runtime.models import Run, Ticket, ToolCallRecord

    worker_env = dict(env, RUNTIME_LEASE_SECONDS="1")
    done: dict[str, int] = {}

    def bump(what: str) -> None:
        done[what] = done.get(what, 0) + 1

    # Indeterminate calls first, alone: each crash worker dies at its first Executing commit.
    for n in range(2 * scale):
        operations.start_run(
            agent="demo",
            input=f"record once, ref zz{uuid.uuid4().hex} {COMMON_WORD if n % 2 else 'payment'}",
            metadata={
                "customer": f"c{n % 7}",
                **script(call("ledger_once", key=f"o{n}"), text("done")),
            },
        )
        crash = dict(worker_env, RUNTIME_CRASH_AT="executing_committed")
        manage(crash, "runtime_worker", "--until-idle", check=False)
        bump("crashed")
    kinds: dict[str, list[str]] = {}
    for round_ in range(scale):
        for n, (kind, metadata) in enumerate(template_mix()):
            word = COMMON_WORD if n % 3 == 0 else "shipment"
            run_id = operations.start_run(
                agent="demo",
                input=f"{kind} task {round_} {word}, ref zz{uuid.uuid4().hex}",
                metadata={"customer": f"c{n % 7}", "kind": kind, **metadata},
                actor="history-bench",
            )
            kinds.setdefault(kind, []).append(run_id)
    note("crash workers done")
    manage(worker_env, "runtime_worker", "--until-idle")
    note("first worker done")
    for kind, runs in kinds.items():
        for run_id in runs:
            ticket = Ticket.objects.filter(run_id=run_id, state="open").first()
            try:
                if kind == "approve" and ticket:
                    command = ResumeCommand(
                        ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE
                    )
                    operations.resume(run_id, command, actor="history-bench")
                elif kind == "deny" and ticket:
                    command = ResumeCommand(
                        ticket_id=ticket.id,
                        kind=TicketKind.APPROVAL,
                        decision=Decision.DENY,
                        reason="not today",
                    )
                    operations.resume(run_id, command, actor="history-bench")
                elif kind == "answer" and ticket:
                    command = ResumeCommand(
                        ticket_id=ticket.id,
                        kind=TicketKind.INPUT,
                        decision=Decision.INPUT,
                        input="the blue one",
                    )
                    operations.resume(run_id, command, actor="history-bench")
                elif kind == "cancel":
                    operations.cancel(run_id, actor="history-bench", reason="bench cancel")
                elif kind == "pause":
                    operations.pause(run_id, actor="history-bench", reason="bench pause")
                elif kind == "fork":
                    operations.fork_run(run_id, at_step=1, input="again", actor="history-bench")
                else:
                    continue
                bump(kind)
            except Exception as exc:  # a refused operation leaves the run as it is
                bump(f"refused {kind}: {type(exc).__name__}")
    for index, call_row in enumerate(ToolCallRecord.objects.filter(phase="indeterminate")):
        if index % 2:
            continue
        outcome = "applied" if index % 4 == 0 else "not_applied"
        try:
            operations.reconcile(
                call_row.id, outcome=outcome, evidence="ledger row checked", actor="history-bench"
            )
            bump("reconciled")
        except Exception as exc:
            bump(f"refused reconcile: {type(exc).__name__}")
    note("operations done")
    manage(worker_env, "runtime_worker", "--until-idle")
    note("second worker done")
    done["template runs"] = Run.objects.count()
    return done


# -- the multiplication ----------------------------------------------------------------------


def copied_tables(cursor) -> list[str]:
    cursor.execute(
        "SELECT DISTINCT table_name FROM information_schema.columns WHERE table_schema = "
        "'public' AND (column_name IN ('run_id', 'thread_id') OR table_name = 'runtime_thread')"
        " AND table_name <> 'runtime_modelslot' ORDER BY table_name"
    )
    return [row[0] for row in cursor.fetchall()]


def copy_prefix(g: int) -> str:
    """The 8 hex digits of copy ``g`` (the template itself is copy 0 and keeps its own)."""
    return f"{(g * KNUTH) % 4294967296:08x}"


def derived_ids() -> dict[str, tuple[str, str] | tuple[str, str, str]]:
    """The template's ids that the product derives from other ids by a hash, by their 32 hex
    digits: ("fork", fork run id, old id) for an id a fork's copy gives an id of its source
    (``fork.copied_id``, uuid5 of the fork's run id and the old id: its runs, calls, operations,
    tickets), ("child", operation id) for a child run's id (``delegation.child_run_id``, uuid5
    of its delegate call's operation id). A copy cannot keep their last 24 digits: it derives
    them again from its own copies of the inputs, as the product would have (``copied_ids``)."""
    from runtime import fork
    from runtime.delegation import child_run_id
    from runtime.models import Run, ToolCallRecord

    derived: dict[str, tuple[str, str] | tuple[str, str, str]] = {}
    forks = Run.objects.filter(metadata__has_key="forked_from").values_list("id", "metadata")
    for run_id, metadata in forks:
        forked = metadata["forked_from"]
        source = fork.prefix(forked["run_id"], forked["step"])
        for old, new in fork.mapping(source, run_id).items():
            if new != run_id:  # the fork's own id is new (uuid4)
                derived[new.removeprefix("op_")] = ("fork", run_id, old)
    children = Run.objects.exclude(parent_call_id=None).values_list("id", "parent_call_id")
    operations = dict(ToolCallRecord.objects.values_list("id", "operation_id"))
    for run_id, call_id in children:
        operation_id = operations.get(call_id or "")
        if operation_id and child_run_id(operation_id) == run_id:
            derived[run_id] = ("child", operation_id)
    return derived


def copied_ids(derived: dict[str, Any], g: int) -> dict[str, str]:
    """Copy ``g``'s id of each derived id (keyed by the template's last 24 digits): the
    derivation applied to copy ``g``'s ids of its inputs (themselves derived, or not)."""
    from runtime import fork
    from runtime.delegation import child_run_id

    prefix, memo = copy_prefix(g), {}

    def of(old: str) -> str:
        if old.startswith("op_"):
            return "op_" + of(old[3:])
        if len(old) != 32 or any(c not in "0123456789abcdef" for c in old):
            return old  # not an id the copy rewrites
        if old not in memo:
            how = derived.get(old)
            if how is None:
                memo[old] = prefix + old[8:]
            elif how[0] == "fork":
                memo[old] = fork.copied_id(of(how[1]), of(how[2])).removeprefix("op_")
            else:
                memo[old] = child_run_id(of(how[1]))
        return memo[old]

    return {old[8:]: of(old) for old in derived}


# The copy of one text in the rows that need more than a regexp_replace: every id and every
# UTC time in it, one by one, in one pass (copy g, its time shift).
COPY_FUNCTIONS = [
    f"""
CREATE FUNCTION pg_temp.hist_token(tok text, g int, shift interval) RETURNS text
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN tok ~ '^[0-9a-f]{{32}}$' THEN coalesce(
      (SELECT d.id FROM hist_derived_copy d WHERE d.g = $2 AND d.tail = right($1, 24)),
      lpad(to_hex(($2 * {KNUTH}::bigint) % 4294967296), 8, '0') || right($1, 24))
    ELSE to_char(($1::timestamptz - $3) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
      || CASE WHEN extract(microseconds FROM $1::timestamptz - $3)::bigint % 1000000 = 0
         THEN '' ELSE to_char(($1::timestamptz - $3) AT TIME ZONE 'UTC', '.US') END
      || '+00:00'
  END
$$""",
    f"""
CREATE FUNCTION pg_temp.hist_text(v text, g int, shift interval) RETURNS text
LANGUAGE sql STABLE AS $$
  SELECT coalesce(string_agg(p.part || coalesce(pg_temp.hist_token(m.a[1], $2, $3), ''), ''
                             ORDER BY p.n), $1)
  FROM regexp_split_to_table($1, '{TOKEN_RX}') WITH ORDINALITY AS p(part, n)
  LEFT JOIN regexp_matches($1, '({TOKEN_RX})', 'g') WITH ORDINALITY AS m(a, n) ON m.n = p.n
$$""",
]


def column_expr(name: str, data_type: str, default: str | None) -> str | None:
    """The copy's value of one column (None: left to its default, a serial id). A template
    row ``hist_slow`` names a derived id or holds a time inside a text: ``hist_text``."""
    quoted = f'"{name}"'
    if default and default.startswith("nextval("):
        return None
    prefix = f"lpad(to_hex((g * {KNUTH}) %% 4294967296), 8, '0')"
    shift = f"(g * interval '{DAYS} days' / %(copies)s)"
    if data_type in ("character varying", "text"):
        fast = f"regexp_replace({quoted}, '{ID_RX}', {prefix} || '\\1', 'g')"
        return f"CASE WHEN hist_slow THEN pg_temp.hist_text({quoted}, g, {shift}) ELSE {fast} END"
    if data_type == "jsonb":
        fast = f"regexp_replace({quoted}::text, '{ID_RX}', {prefix} || '\\1', 'g')::jsonb"
        slow = f"pg_temp.hist_text({quoted}::text, g, {shift})::jsonb"
        return f"CASE WHEN hist_slow THEN {slow} ELSE {fast} END"
    if data_type.startswith("timestamp"):
        return f"{quoted} - {shift}"
    return quoted


def multiply(copies: int) -> dict[str, float]:
    """Copy every run-bearing table ``copies`` times; return seconds per table."""
    from django.db import connection, transaction

    derived = derived_ids()
    gs, tails, ids = [], [], []
    for g in range(1, copies + 1):
        for tail, new in copied_ids(derived, g).items():
            gs.append(g)
            tails.append(tail)
            ids.append(new)
    seconds: dict[str, float] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute("CREATE TEMP TABLE hist_derived (tail text PRIMARY KEY)")
        cursor.execute(
            "INSERT INTO hist_derived SELECT unnest(%s::text[])", [[d[8:] for d in derived]]
        )
        cursor.execute(
            "CREATE TEMP TABLE hist_derived_copy (g int, tail text, id text, PRIMARY KEY (g, tail))"
        )
        cursor.execute(
            "INSERT INTO hist_derived_copy SELECT * FROM unnest(%s::int[], %s::text[], %s::text[])",
            [gs, tails, ids],
        )
        cursor.execute("ANALYZE hist_derived_copy")
        for function in COPY_FUNCTIONS:
            cursor.execute(function)
        for table in copied_tables(cursor):
            cursor.execute(
                "SELECT column_name, data_type, column_default, is_identity "
                "FROM information_schema.columns WHERE table_schema = 'public' "
                "AND table_name = %s ORDER BY ordinal_position",
                [table],
            )
            names, exprs = [], []
            for name, data_type, default, identity in cursor.fetchall():
                expr = None if identity == "YES" else column_expr(name, data_type, default)
                if expr is not None:
                    names.append(f'"{name}"')
                    exprs.append(expr)
            started = time.perf_counter()
            # hist_slow: the template row holds a derived id or a time inside a text (a
            # timestamp column's text form has no "T"), so its texts are copied one id and
            # one time at a time; every other row by one regexp_replace a column.
            cursor.execute(
                f"CREATE TEMP TABLE \"t_{table}\" AS SELECT x.*, (x::text ~ '{TIME_RX}' OR "
                f"EXISTS (SELECT FROM regexp_matches(x::text, '{ID_RX}', 'g') AS m(a) "
                f'JOIN hist_derived d ON d.tail = m.a[1])) AS hist_slow FROM "{table}" x'
            )
            cursor.execute(
                f'INSERT INTO "{table}" ({", ".join(names)}) SELECT {", ".join(exprs)} '
                f'FROM "t_{table}", generate_series(1, %(copies)s) AS g',
                {"copies": copies},
            )
            seconds[table] = time.perf_counter() - started
        # The copies went in with triggers off, so the run counts (runtime_runcount, kept by
        # triggers: migration 0018) still count the template alone: count them again.
        cursor.execute("DELETE FROM runtime_runcount")
        cursor.execute(
            "INSERT INTO runtime_runcount (agent, state, end_cause, n) "
            "SELECT agent, state, coalesce(end_cause, ''), count(*) FROM runtime_run "
            "GROUP BY agent, state, coalesce(end_cause, '')"
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return seconds


def thread_kind(thread_id: str) -> str:
    """What the template made of a thread: its runs' kinds ("child", "+forked", "crashed")."""
    from runtime.models import Run

    kinds = set()
    for metadata, depth in Run.objects.filter(thread_id=thread_id).values_list("metadata", "depth"):
        kind = "child" if depth else (metadata or {}).get("kind", "crashed")
        kinds.add(kind + ("+forked" if "forked_from" in (metadata or {}) else ""))
    return ",".join(sorted(kinds))


def fsck_sample(template: list[str], copies: int, whole: int, sample: int) -> dict[str, Any]:
    """``runtime.fsck.check`` in process on every thread of the template, of ``whole`` copies
    (at random: each copy holds every kind of thread the template has, forks, delegations,
    timers and approvals among them) and of ``sample`` more random threads. Besides fsck, a
    child run's id must be what its delegate call's operation id derives."""
    import random

    from runtime import fsck
    from runtime.delegation import child_run_id
    from runtime.models import Run, Thread, ToolCallRecord

    chosen = random.sample(range(1, copies + 1), min(whole, copies))
    threads = list(template)
    for g in chosen:
        threads += [copy_prefix(g) + t[8:] for t in template]
    threads += list(Thread.objects.order_by("?").values_list("id", flat=True)[:sample])
    threads = list(dict.fromkeys(threads))
    bad: list[dict[str, str]] = []
    kinds: dict[str, dict[str, int]] = {}
    for thread_id in threads:
        found = [str(v) for v in fsck.check(thread_id)]
        children = Run.objects.filter(thread_id=thread_id).exclude(parent_call_id=None)
        for run_id, call_id in children.values_list("id", "parent_call_id"):
            call = ToolCallRecord.objects.filter(id=call_id).values("operation_id").first()
            if call is None or child_run_id(call["operation_id"]) != run_id:
                found.append(f"child run {run_id} is not derived from its call {call_id}")
        kind = thread_kind(thread_id)
        counts = kinds.setdefault(kind, {"clean": 0, "unclean": 0})
        counts["unclean" if found else "clean"] += 1
        if found:
            bad.append({"thread": thread_id, "kind": kind, "out": "\n".join(found)[-600:]})
    return {"checked": len(threads), "copies": sorted(chosen), "kinds": kinds, "failed": bad}


def build(database_url: str, runs: int, scale: int, sample: int, whole: int = 1) -> dict[str, Any]:
    name = database_url.rsplit("/", 1)[1]
    with admin_connect(database_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    env = environment(database_url)
    started = time.perf_counter()
    manage(env, "migrate", "--noinput", "-v0")
    from runtime.models import Run, Thread

    template = build_template(env, scale)
    threads = list(Thread.objects.values_list("id", flat=True))
    templated = time.perf_counter()
    per_copy = Run.objects.count()
    copies = max(0, round(runs / per_copy) - 1)
    seconds = multiply(copies)
    multiplied = time.perf_counter()
    fsck = fsck_sample(threads, copies, whole, sample)
    report = {
        "database": name,
        "runs": Run.objects.count(),
        "template": template,
        "copies": copies,
        "template_s": round(templated - started, 1),
        "multiply_s": round(multiplied - templated, 1),
        "multiply_by_table_s": {k: round(v, 1) for k, v in seconds.items()},
        "fsck_sample": fsck,
    }
    print(json.dumps(report, indent=2), file=sys.stderr)
    return report


# -- the reads ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def cursor_at(model, fraction: float, newest_first: bool = True) -> str:
    """The keyset cursor of the row ``fraction`` deep into ``model``'s listing."""
    from console.api.pagination import encode_cursor

    rows = model.objects.order_by("-created_at" if newest_first else "created_at", "-pk")
    row = rows.values("created_at", "pk")[int(rows.count() * fraction)]
    return encode_cursor(row["created_at"], row["pk"])


def pick(query, default: str = "") -> str:
    value = query.first()
    if isinstance(value, tuple):
        value = value[0]
    return str(value) if value is not None else default


def the_reads() -> list[tuple[str, str, str]]:
    """(name, kind, path): kind is "console" (session) or "api" (token) or "open"."""
    from runtime.models import Run, Ticket, ToolCallRecord

    def run_of(**filters: Any) -> str:
        return pick(Run.objects.filter(**filters).order_by("created_at").values_list("id"))

    rare = pick(
        Run.objects.filter(metadata__kind="natural")
        .order_by("-created_at")
        .values_list("snapshot"),
    )
    rare_word = next(
        (
            w
            for w in rare.replace("'", " ").replace(",", " ").split()
            if w.startswith("zz") and len(w) == 34
        ),
        "zz" + "0" * 32,
    )
    middle = pick(Run.objects.order_by("created_at").values_list("id")[Run.objects.count() // 2 :])
    deep_run = cursor_at(Run, 0.5)
    deep_ticket = cursor_at(Ticket, 0.5)
    deep_call = cursor_at(ToolCallRecord, 0.5)
    reads = [
        ("console runs", "console", "/"),
        ("console runs, 2nd page deep", "console", f"/?cursor={deep_run}"),
        ("console runs state=awaiting", "console", "/?state=awaiting"),
        ("console runs state=ended cause=failed", "console", "/?state=ended&cause=failed"),
        ("console runs agent=demo", "console", "/?agent=demo"),
        ("console search common word", "console", f"/?q={COMMON_WORD}"),
        ("console search rare word", "console", f"/?q={rare_word}"),
        ("console search absent word", "console", f"/?q={ABSENT_WORD}"),
        ("console search id prefix", "console", f"/?q={middle[:10]}"),
        ("console inbox", "console", "/inbox/"),
        ("console reconcile", "console", "/reconcile/"),
        ("console audit", "console", "/audit/"),
        ("console workers", "console", "/workers/"),
        ("api runs", "api", "/api/v1/runs"),
        ("api runs deep cursor", "api", f"/api/v1/runs?cursor={deep_run}"),
        ("api runs q common", "api", f"/api/v1/runs?q={COMMON_WORD}"),
        ("api runs q rare", "api", f"/api/v1/runs?q={rare_word}"),
        ("api runs q absent", "api", f"/api/v1/runs?q={ABSENT_WORD}"),
        ("api runs q id prefix", "api", f"/api/v1/runs?q={middle[:10]}"),
        ("api runs meta_key/value", "api", "/api/v1/runs?meta_key=customer&meta_value=c3"),
        ("api runs tool", "api", "/api/v1/runs?tool=ledger_once"),
        ("api tickets open", "api", "/api/v1/tickets"),
        ("api tickets all deep cursor", "api", f"/api/v1/tickets?state=all&cursor={deep_ticket}"),
        ("api tool-calls", "api", "/api/v1/tool-calls"),
        (
            "api tool-calls all deep cursor",
            "api",
            f"/api/v1/tool-calls?all=true&cursor={deep_call}",
        ),
        ("api run document", "api", f"/api/v1/runs/{middle}"),
        ("/metrics", "open", "/metrics"),
        ("/readyz", "open", "/readyz"),
    ]
    pages = {
        "natural": run_of(metadata__kind="natural"),
        "step limit": run_of(end_cause="step_limit"),
        "failed": run_of(end_cause="failed"),
        "cancelled": run_of(end_cause="cancelled"),
        "indeterminate": run_of(end_cause="indeterminate"),
        "awaiting approval": run_of(tickets__state="open", tickets__kind="approval"),
        "awaiting input": run_of(tickets__state="open", tickets__kind="input"),
        "paused": run_of(paused=True),
        "delegating parent": run_of(metadata__kind="delegate"),
        "child": run_of(depth__gt=0),
        "forked": run_of(metadata__has_key="forked_from"),
    }
    reads += [(f"console run page: {k}", "console", f"/runs/{v}/") for k, v in pages.items() if v]
    return reads


def measure_http(base: str, reads, cookie: str, token: str, requests: int) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=120) as client:
        for name, kind, path in reads:
            headers = {}
            if kind == "console":
                headers["Cookie"] = f"sessionid={cookie}"
            elif kind == "api":
                headers["Authorization"] = f"Bearer {token}"
            times, statuses = [], set()
            for index in range(requests + 1):
                started = time.perf_counter()
                response = client.get(path, headers=headers)
                if index:  # the first one warms up
                    times.append((time.perf_counter() - started) * 1000)
                statuses.add(response.status_code)
            out[name] = {
                "p50": percentiles(times)[0],
                "p95": percentiles(times)[1],
                "status": sorted(statuses),
            }
    return out


def first_byte(base: str, token: str, run_id: str, requests: int) -> dict[str, Any]:
    import httpx

    times = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=60) as client:
        for index in range(requests + 1):
            started = time.perf_counter()
            with client.stream("GET", f"/api/v1/runs/{run_id}/events", headers=headers) as resp:
                next(resp.iter_raw(), b"")
            if index:
                times.append((time.perf_counter() - started) * 1000)
    p50, p95 = percentiles(times)
    return {"p50": p50, "p95": p95, "status": [resp.status_code]}


def timed_commands(env: dict[str, str], requests: int) -> dict[str, Any]:
    from runtime.models import Run
    from runtime.worker import claim

    run = (
        Run.objects.filter(state="ended")
        .order_by("created_at")
        .values("id", "thread_id")[Run.objects.count() // 2]
    )
    out: dict[str, Any] = {}
    commands = {
        "runtime_export (one thread)": ["runtime_export", run["id"], "--output", os.devnull],
        "runtime_fsck --thread": ["runtime_fsck", "--thread", run["thread_id"]],
        "runtime_prune --dry-run": ["runtime_prune", "--ended-before", str(DAYS // 2), "--dry-run"],
    }
    for name, args in commands.items():
        times = []
        for _ in range(min(3, requests)):  # a process each: Django's start-up is in every figure
            started = time.perf_counter()
            manage(env, *args)
            times.append((time.perf_counter() - started) * 1000)
        p50, p95 = percentiles(times)
        out[name + " (process, 3x)"] = {"p50": p50, "p95": p95, "status": [0]}
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        claim("history-bench-claim")
        times.append((time.perf_counter() - started) * 1000)
    p50, p95 = percentiles(times)
    out["claim (in process, idle poll)"] = {"p50": p50, "p95": p95, "status": [0]}
    return out


def slow_statements(reads, user, slow_ms: float) -> list[dict[str, Any]]:
    """Each read once in process; the EXPLAIN (ANALYZE, BUFFERS) of each statement over
    ``slow_ms``."""
    from django.db import connection
    from django.test import Client

    seen: list[tuple[str, str, Any, float]] = []
    current = [""]  # the read being made

    def wrapper(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            if elapsed > slow_ms and not many and sql.lstrip().upper().startswith("SELECT"):
                seen.append((current[0], sql, params, elapsed))

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    from console.models import ApiToken

    _, token = ApiToken.issue(user, name="history-bench-inprocess")
    out = []
    with connection.execute_wrapper(wrapper):
        for name, kind, path in reads:
            current[0] = name
            headers = {"Authorization": f"Bearer {token}"} if kind == "api" else {}
            client.get(path, headers=headers)
    for read, sql, params, elapsed in seen:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        out.append({"read": read, "ms": round(elapsed, 1), "sql": sql, "plan": plan})
    return out


def storage() -> dict[str, float]:
    from django.db import connection

    from runtime.models import Run

    runs = max(1, Run.objects.count())
    with connection.cursor() as cursor:
        tables = copied_tables(cursor)
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)",
            [tables],
        )
        sizes = {name: size / runs for name, size in cursor.fetchall()}
    sizes["total"] = sum(sizes.values())
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


@contextmanager
def serve(env: dict[str, str]) -> Iterator[str]:
    """daphne serving ``console.asgi:application`` on a free loopback port, with ``env``;
    yields its base URL and stops it on exit."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        port = free_port()
        log = Path(tmp) / "daphne.log"
        with log.open("w") as sink:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "console.asgi:application",
                ],
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=sink,
            )

        def stop() -> None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

        stack.callback(stop)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"daphne did not start:\n{log.read_text()}") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"


def sign_in() -> tuple[Any, str, str]:
    """The bench's operator (every console permission): ``(user, session cookie, API
    token)``."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.test import Client

    from console.models import ApiToken

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.is_staff = user.is_superuser = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="console"))
    _, token = ApiToken.issue(user, name="history-bench")
    login = Client()
    login.force_login(user)
    return user, login.cookies["sessionid"].value, token


def measure(database_url: str, requests: int, slow_ms: float) -> dict[str, Any]:
    from runtime.models import Run

    env = environment(database_url)
    user, cookie, token = sign_in()
    reads = the_reads()
    stream_run = pick(Run.objects.filter(state="ended").order_by("-created_at").values_list("id"))
    with serve(env) as base:
        figures = measure_http(base, reads, cookie, token, requests)
        figures["event stream first byte"] = first_byte(base, token, stream_run, requests)
    figures.update(timed_commands(env, requests))
    return {
        "runs": Run.objects.count(),
        "reads": figures,
        "slow": slow_statements(reads, user, slow_ms),
        "bytes_per_run": storage(),
    }


# -- the table ---------------------------------------------------------------------------------


def table(results: dict[int, dict[str, Any]]) -> str:
    sizes = list(results)
    head = (
        "| read | " + " | ".join(f"{results[n]['runs']:,} runs p50 / p95 ms" for n in sizes) + " |"
    )
    lines = [head, "|---|" + "---|" * len(sizes)]
    names = list(dict.fromkeys(name for n in sizes for name in results[n]["reads"]))
    for name in names:
        cells = []
        for n in sizes:
            fig = results[n]["reads"].get(name)
            bad = "" if not fig or all(s < 400 for s in fig["status"]) else f" ({fig['status']})"
            cells.append(f"{fig['p50']:.1f} / {fig['p95']:.1f}{bad}" if fig else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| bytes per run | " + " | ".join(f"{n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    tables = list(dict.fromkeys(t for n in sizes for t in results[n]["bytes_per_run"]))
    for name in tables:
        cells = [f"{results[n]['bytes_per_run'].get(name, 0):,.0f}" for n in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL, help="the server (no name)")
    parser.add_argument("--database-prefix", default="hist_bench")
    parser.add_argument("--runs", type=int, nargs="+", default=[10_000])
    parser.add_argument("--build", action="store_true", help="only build")
    parser.add_argument("--measure", action="store_true", help="only measure (built before)")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--slow-ms", type=float, default=50.0)
    parser.add_argument("--template-scale", type=int, default=5)
    parser.add_argument("--fsck-sample", type=int, default=10, help="random threads to fsck")
    parser.add_argument(
        "--fsck-copies", type=int, default=1, help="whole copies to fsck (with the template)"
    )
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        raise SystemExit("bench/history.py needs PostgreSQL (--database-url postgres://...)")
    if args.requests < 1:
        raise SystemExit("--requests is at least 1")
    server = (
        args.database_url.rstrip("/").rsplit("/", 1)[0]
        if args.database_url.count("/") > 2 and not args.database_url.endswith("/")
        else args.database_url.rstrip("/")
    )
    results: dict[int, dict[str, Any]] = {}
    builds: dict[int, Any] = {}
    first = True
    for runs in args.runs:
        url = f"{server}/{args.database_prefix}_{runs}"
        if first:
            setup_django(url)
            first = False
        from django.db import connections

        connections["default"].close()
        connections["default"].settings_dict["NAME"] = f"{args.database_prefix}_{runs}"
        os.environ["DATABASE_URL"] = url
        if not args.measure:
            builds[runs] = build(url, runs, args.template_scale, args.fsck_sample, args.fsck_copies)
            connections["default"].close()
        if not args.build:
            results[runs] = measure(url, args.requests, args.slow_ms)
            connections["default"].close()
    if builds:
        print("## Build\n")
        for runs, report in builds.items():
            fsck = report["fsck_sample"]
            print(
                f"- {runs:,}: {report['runs']:,} runs, {report['copies']:,} copies of "
                f"{report['template'].get('template runs')} template runs; template "
                f"{report['template_s']} s, multiplication {report['multiply_s']} s; fsck "
                f"{fsck['checked'] - len(fsck['failed'])}/{fsck['checked']} threads clean"
            )
            print(f"  template: {report['template']}")
            kinds = {
                k: f"{v['clean']}/{v['clean'] + v['unclean']}" for k, v in fsck["kinds"].items()
            }
            print(f"  fsck clean by kind (template, copies {fsck['copies']}, sample): {kinds}")
            for bad in fsck["failed"][:3]:
                print(f"  fsck failed: {bad}")
        print()
    if results:
        print("## Reads\n")
        print(table(results))
        print("\n## Statements over", args.slow_ms, "ms\n")
        for runs, result in results.items():
            for slow in result["slow"]:
                print(f"### {runs:,} runs, {slow['read']}: {slow['ms']} ms\n")
                print("```\n" + slow["sql"][:2000] + "\n\n" + slow["plan"] + "\n```\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"builds": builds, "results": results}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
