"""Limits on what runs at once, kept by the database for every worker process and machine.

**Runs.** A run of a limited agent holds a slot exactly while it is Running and a worker holds
its live lease (``RunQuerySet.driven``): slots are not counted in a separate table, so no
crash, lapse, park or end can leak one. When a run parks, ends, is released or its worker
dies and its lease lapses, its slot is free in the same instant. Claims of limited agents
(``claim_limited``) run in one transaction that first locks the agents' ``Limit`` rows
(``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite has one writer at a time), then counts the
held slots and takes the oldest runnable runs that fit (``domain.limits.admit``): a second
claimer waits on the lock and, under READ COMMITTED, counts after the first one committed, so
two claimers never take the same free slot.

**Models.** An inference of a limited model holds a ``ModelSlot`` row named after its claim
(run, lease epoch); the row counts only while that lease is live, so a dead worker's slots
free themselves when its leases lapse. The model's ``Limit`` row, locked the same way, holds a
token bucket (requests a minute) and ``not_before``: a provider's 429 with ``Retry-After``
pushes it forward, which stops every worker from asking that model until then.

A run that must wait for a model is released (no lease, no thread, no connection) with
``wait_until`` and ``waiting`` (why); a run waiting for a run slot is simply not claimed, and
``why_waiting`` says why from the counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, CharField, Exists, F, OuterRef, Q, Value, When, Window
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, Now, RowNumber
from django.utils import timezone

from runtime import conf, db, versions
from runtime.agents import Agent, registry
from runtime.db import db_now
from runtime.domain.limits import (
    Bucket,
    Candidate,
    Grant,
    ModelLimit,
    RunLimit,
    Wait,
    admit,
    run_wait_reason,
    slowed,
    take_inference,
)
from runtime.models import Limit, ModelSlot, Run

log = logging.getLogger("runtime.limits")


def run_limits() -> dict[str, RunLimit]:
    """The run limit of every limited agent: its declaration (``Agent.limits``), replaced by
    its RUNTIME_RUN_LIMITS entry when it has one."""
    declared = {name: a.limits for name, a in registry().items() if a.limits is not None}
    return {**declared, **conf.run_limits()}


def model_of(agent: Agent) -> str:
    """The name a model's limit is declared under: the provider's model, or its kind when it
    names none (the scripted model: "scripted")."""
    return agent.provider.model or agent.provider.kind


def model_limit(agent: Agent) -> ModelLimit | None:
    """The RUNTIME_MODEL_LIMITS entry of ``agent``'s model, or None."""
    return conf.model_limits().get(model_of(agent))


# -- runs -----------------------------------------------------------------------------------


def _key_of(limits: dict[str, RunLimit]) -> Any:
    """The key value of a run as a query expression: its agent's metadata field ("" when the
    agent has no key or the run's metadata lacks it)."""
    whens = [
        When(agent=agent, then=Coalesce(KT(f"metadata__{limit.key}"), Value("")))
        for agent, limit in limits.items()
        if limit.key is not None
    ]
    if not whens:
        return Value("", output_field=CharField())
    return Case(*whens, default=Value(""), output_field=CharField())


def _lock(keys: list[str]) -> None:
    """Lock the ``Limit`` rows of ``keys`` (created when missing) until the transaction ends.
    SQLite's transactions take the one write lock at BEGIN (IMMEDIATE): nothing to do."""
    if db.connection.vendor != "postgresql" or not keys:
        return
    table = Limit._meta.db_table
    with db.connection.cursor() as cursor:
        cursor.execute(
            f"SELECT key FROM {table} WHERE key = ANY(%s) ORDER BY key FOR UPDATE", [keys]
        )
        if len(cursor.fetchall()) == len(keys):
            return
        cursor.execute(
            f"INSERT INTO {table} (key, tokens) SELECT unnest(%s::text[]), 0 "
            "ON CONFLICT DO NOTHING",
            [keys],
        )
        cursor.execute(
            f"SELECT key FROM {table} WHERE key = ANY(%s) ORDER BY key FOR UPDATE", [keys]
        )


def held(
    limits: dict[str, RunLimit], now: Any, driving: tuple[str, ...] = ()
) -> dict[tuple[str, str], int]:
    """The runs of limited agents driven now, counted by (agent, key value)."""
    rows = (
        Run.objects.driven(now, driving)
        .filter(agent__in=list(limits))
        .annotate(limit_key=_key_of(limits))
        .values_list("agent", "limit_key")
    )
    counts: dict[tuple[str, str], int] = {}
    for agent, key in rows:
        counts[(agent, str(key))] = counts.get((agent, str(key)), 0) + 1
    return counts


def claim_limited(
    limits: dict[str, RunLimit], want: int, driving: tuple[str, ...] = (), allowed: Q | None = None
) -> list[str]:
    """Pick up to ``want`` runnable runs of limited agents that fit their limits (and
    ``allowed``, the versions' condition of ``runtime.versions``), oldest commit first, and
    return their ids; the caller takes their leases in the same transaction (which must be
    open: the lock lasts until it ends).

    A key's backlog never hides another key's runs: each agent's candidates are at most
    ``per_key`` runs of each key, oldest first (``_candidates``), so the oldest runnable run
    of a key with room is always among them, however many runs a saturated key has."""
    now = db_now()
    _lock([f"agent:{name}" for name in sorted(limits)])
    counts = held(limits, now, driving)
    candidates: list[tuple[Any, Candidate]] = []
    for agent, limit in sorted(limits.items()):
        mine = sum(n for (a, _key), n in counts.items() if a == agent)
        room = want if limit.runs is None else min(want, limit.runs - mine)
        if room > 0:
            candidates += _candidates(agent, limit, now, driving, room + mine, allowed or Q())
    candidates.sort(key=lambda c: (c[0], c[1].run_id))
    return admit([c for _at, c in candidates], counts, limits, want)


def _candidates(
    agent: str, limit: RunLimit, now: Any, driving: tuple[str, ...], most: int, allowed: Q
) -> list[tuple[Any, Candidate]]:
    """The runnable runs of ``agent`` a claim may take, with their commit instants: the
    oldest ``per_key`` of each key (a window per key), then the oldest ``most`` of those.

    ``most`` is the agent's free slots plus the runs it holds: a key can only refuse as many
    of its candidates as it holds slots, so that many more always reach the free slots."""
    rows = (
        Run.objects.runnable(now)
        .filter(allowed, agent=agent)
        .exclude(id__in=driving)
        .annotate(limit_key=_key_of({agent: limit}))
    )
    if limit.key is not None:
        rows = rows.annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("limit_key")],
                order_by=[F("committed_at").asc(), F("id").asc()],
            )
        ).filter(rank__lte=limit.per_key)
    picked = rows.order_by("committed_at", "id").values_list("id", "limit_key", "committed_at")[
        :most
    ]
    return [(at, Candidate(run_id, agent, str(key))) for run_id, key, at in picked]


def key_of(run: Run, limit: RunLimit) -> str:
    """The key value of ``run`` under ``limit`` as the claim counts it ("" without a key):
    the database's text of its metadata field, read with the claim's own expression, so that a
    true, a null or an object value names the same key here as in the claim."""
    if limit.key is None:
        return ""
    value = (
        Run.objects.filter(id=run.id)
        .annotate(limit_key=_key_of({run.agent: limit}))
        .values_list("limit_key", flat=True)
        .first()
    )
    return "" if value is None else str(value)


def why_waiting(run: Run) -> str:
    """Why a Running run that no worker holds is not driven ("" when nothing holds it back
    but a free worker): the model budget it was released to wait for, no live worker that
    may drive its agent's version ("waiting for a worker with version X of agent Y",
    ``runtime.versions``), or its agent's or its key's slots all held ("waiting for a slot:
    agent X, 5 of 5 running"). A paused run waits for its resume, which its pause line says:
    "" for it."""
    if run.state != "running" or run.paused:
        return ""
    now = timezone.now()
    if run.lease_expires_at is not None and run.lease_expires_at >= now:
        return ""
    if run.waiting and run.wait_until is not None and run.wait_until > now:
        return run.waiting
    unserved = versions.no_worker(run)
    if unserved:
        return unserved
    limit = run_limits().get(run.agent)
    if limit is None:
        return ""
    counts = held({run.agent: limit}, db_now())
    key = key_of(run, limit)
    return (
        run_wait_reason(
            run.agent,
            limit.key,
            key,
            limit,
            sum(counts.values()),
            counts.get((run.agent, key), 0),
        )
        or ""
    )


# -- models -----------------------------------------------------------------------------------


def model_unavailable_since(run_id: str) -> datetime | None:
    """When the model of the step ``run_id`` is on began to fail retryably, as recorded when
    a worker released the run to wait for it; None when it has not failed in this step (a
    time before the run's last commit belongs to an earlier step)."""
    since, committed = (
        Run.objects.filter(id=run_id).values_list("model_unavailable_since", "committed_at").get()
    )
    if since is None or (committed is not None and since < committed):
        return None
    return since


def waiting_for_model() -> int:
    """How many runs are released to wait for a model that keeps failing (a metric): Running,
    not before their next try, and failing in the step they are on. Reads the Running runs
    alone (index run_state_recent), never the ended history."""
    return Run.objects.filter(
        state="running",
        wait_until__gt=timezone.now(),
        model_unavailable_since__gte=Coalesce(F("committed_at"), F("created_at")),
    ).count()


def _live_slot() -> Q:
    """A ModelSlot whose claim still holds a live lease."""
    live = Run.objects.filter(
        id=OuterRef("run_id"),
        lease_epoch=OuterRef("epoch"),
        state="running",
        lease_expires_at__gte=db_now(),
    )
    return Q(Exists(live))


def _locked_budget(model: str) -> tuple[Limit, datetime]:
    """The model's Limit row, locked until the transaction ends (created the first time),
    and the database's now, in one statement on PostgreSQL."""
    key = f"model:{model}"
    rows = Limit.objects.filter(key=key).select_for_update()
    postgres = db.connection.vendor == "postgresql"
    if postgres:
        rows = rows.annotate(t=Now())
    row = rows.first()
    if row is None:
        Limit.objects.bulk_create([Limit(key=key)], ignore_conflicts=True)
        row = rows.first()
    assert row is not None
    return row, row.t if postgres else timezone.now()  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Slot:
    """An inference slot taken (its ModelSlot row id; None for a model without a
    concurrency bound)."""

    slot_id: int | None


def take_model(model: str, limit: ModelLimit, run_id: str, epoch: int) -> Slot | Wait:
    """Take a slot of ``model`` for the claim (run, epoch), or say how long to wait and why.

    One transaction: lock the model's row, drop slots whose claim lapsed, count the live
    ones, decide (``domain.limits.take_inference``) and write what was granted."""
    with db.atomic():
        row, now = _locked_budget(model)
        slots = ModelSlot.objects.filter(model=model)
        in_flight = 0
        if limit.concurrency is not None:
            slots.exclude(_live_slot()).delete()
            in_flight = slots.count()
        bucket = Bucket(row.tokens, row.refilled_at, row.not_before)
        decision = take_inference(model, limit, bucket, in_flight, now)
        if isinstance(decision, Wait):
            return decision
        assert isinstance(decision, Grant)
        if limit.per_minute is not None:
            Limit.objects.filter(key=row.key).update(
                tokens=decision.bucket.tokens, refilled_at=decision.bucket.refilled_at
            )
        if limit.concurrency is None:
            return Slot(None)
        return Slot(ModelSlot.objects.create(model=model, run_id=run_id, epoch=epoch).id)


def give_back(slot: Slot, model: str, retry_after: float | None = None) -> None:
    """Free an inference slot (a slot whose claim lapsed is freed by the next take).

    With ``retry_after`` (the provider answered 429 with Retry-After) the model's pause is
    recorded first, in the same transaction: no other worker can take the freed slot before
    the pause is there to refuse it."""
    with db.atomic():
        if retry_after is not None:
            _slow(model, retry_after)
        if slot.slot_id is not None:
            ModelSlot.objects.filter(id=slot.slot_id).delete()


def _slow(model: str, retry_after: float) -> datetime:
    """Push the model's ``not_before`` to ``retry_after`` seconds from now (never earlier
    than it was), for every worker; return it. Inside the caller's transaction."""
    row, now = _locked_budget(model)
    until = slowed(row.not_before, now, retry_after)
    Limit.objects.filter(key=row.key).update(not_before=until)
    log.warning("model %s: the provider asked for a pause; no request before %s", model, until)
    return until


# -- use, for the console, the API, the CLI and metrics -------------------------------------


def usage() -> dict[str, list[dict[str, Any]]]:
    """Each limit and its use now: ``{"runs": [{"agent", "runs", "running", "waiting",
    "key", "per_key", "busiest_key", "busiest_running"}], "models": [{"model",
    "concurrency", "in_flight", "per_minute", "tokens", "not_before", "waiting"}]}``."""
    return {"runs": _run_usage(), "models": _model_usage()}


def _run_usage() -> list[dict[str, Any]]:
    limits = run_limits()
    if not limits:
        return []
    now = db_now()
    counts = held(limits, now)
    waiting: dict[str, int] = {}
    for agent in (
        Run.objects.runnable(now).filter(agent__in=list(limits)).values_list("agent", flat=True)
    ):
        waiting[agent] = waiting.get(agent, 0) + 1
    out = []
    for agent, limit in sorted(limits.items()):
        mine = {key: n for (a, key), n in counts.items() if a == agent}
        busiest = max(mine.items(), key=lambda kv: kv[1], default=("", 0))
        out.append(
            {
                "agent": agent,
                "runs": limit.runs,
                "running": sum(mine.values()),
                "waiting": waiting.get(agent, 0),
                "key": limit.key,
                "per_key": limit.per_key,
                "busiest_key": busiest[0] if limit.key else None,
                "busiest_running": busiest[1] if limit.key else None,
            }
        )
    return out


def _model_usage() -> list[dict[str, Any]]:
    limits = conf.model_limits()
    if not limits:
        return []
    rows = {r.key: r for r in Limit.objects.filter(key__in=[f"model:{m}" for m in limits])}
    now = timezone.now()
    out = []
    for model, limit in sorted(limits.items()):
        row = rows.get(f"model:{model}")
        bucket = (
            Bucket(0, None, None)
            if row is None
            else Bucket(row.tokens, row.refilled_at, row.not_before)
        )
        tokens = None
        if limit.per_minute is not None:
            from runtime.domain.limits import refill

            tokens = round(refill(limit.per_minute, bucket, now), 2)
        paused = bucket.not_before if bucket.not_before and bucket.not_before > now else None
        out.append(
            {
                "model": model,
                "concurrency": limit.concurrency,
                "in_flight": ModelSlot.objects.filter(model=model).filter(_live_slot()).count(),
                "per_minute": limit.per_minute,
                "tokens": tokens,
                "not_before": paused,
                "waiting": Run.objects.filter(
                    state="running", wait_until__gt=now, waiting__contains=f"model {model}"
                ).count(),
            }
        )
    return out


def wait_delta(seconds: float | None) -> timedelta:
    """How long a run refused by a model waits, released, before it is tried again."""
    poll = conf.limit_poll_seconds()
    return timedelta(seconds=poll if seconds is None else max(seconds, 0.0))
