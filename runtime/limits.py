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

from django.db.models import Case, CharField, Exists, OuterRef, Q, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from runtime import conf, db
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

SCAN = 500  # runnable runs of limited agents a claim looks at, oldest first


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
    limits: dict[str, RunLimit], want: int, driving: tuple[str, ...] = ()
) -> list[str]:
    """Pick up to ``want`` runnable runs of limited agents that fit their limits, oldest
    commit first, and return their ids; the caller takes their leases in the same
    transaction (which must be open: the lock lasts until it ends)."""
    now = db_now()
    _lock([f"agent:{name}" for name in sorted(limits)])
    counts = held(limits, now, driving)
    rows = (
        Run.objects.runnable(now)
        .filter(agent__in=list(limits))
        .exclude(id__in=driving)
        .annotate(limit_key=_key_of(limits))
        .order_by("committed_at", "id")
        .values_list("id", "agent", "limit_key")[:SCAN]
    )
    candidates = [Candidate(run_id, agent, str(key)) for run_id, agent, key in rows]
    return admit(candidates, counts, limits, want)


def why_waiting(run: Run) -> str:
    """Why a Running run that no worker holds is not driven ("" when nothing holds it back
    but a free worker): the model budget it was released to wait for, or its agent's or its
    key's slots all held ("waiting for a slot: agent X, 5 of 5 running")."""
    if run.state != "running":
        return ""
    now = timezone.now()
    if run.lease_expires_at is not None and run.lease_expires_at >= now:
        return ""
    if run.waiting and run.wait_until is not None and run.wait_until > now:
        return run.waiting
    limit = run_limits().get(run.agent)
    if limit is None:
        return ""
    counts = held({run.agent: limit}, db_now())
    key = ""
    if limit.key is not None:
        key = str((run.metadata or {}).get(limit.key, ""))
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


def give_back(slot: Slot) -> None:
    """Free an inference slot (a slot whose claim lapsed is freed by the next take)."""
    if slot.slot_id is not None:
        ModelSlot.objects.filter(id=slot.slot_id).delete()


def slow_model(model: str, retry_after: float) -> datetime:
    """Push the model's ``not_before`` to ``retry_after`` seconds from now (never earlier
    than it was), for every worker; return it."""
    with db.atomic():
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
