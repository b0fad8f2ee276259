"""The agents' versions a fleet carries, and the claim condition they make (issue 34, item 2).

A worker writes the versions it carries into its registration (``WorkerProcess.agents``);
a claim reads the live workers' pairs (one small query of the registrations) and takes only
the runs ``runtime.domain.versions.claimable`` allows, as an ORM filter (``Claimable.q``)
or as SQL for the PostgreSQL claim statement (``Claimable.sql``). A run no live worker may
drive says why (``no_worker``) in "why is it not moving", the API and a metric.

A worker is live here as on the Workers page: it has not said it stopped and it was heard from
within two lease periods (``inventory.stale_after``). A killed worker's version stops holding
its runs back then.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from runtime import conf, inventory
from runtime.agents import registry
from runtime.db import connection
from runtime.domain.model import RunState
from runtime.domain.versions import Pair, Routing, no_worker_reason
from runtime.models import Run, WorkerProcess

OPEN = (RunState.RUNNING.value, RunState.AWAITING.value)  # a run not ended
# The runs of one version counted at most ("500+" beyond): a page's worth, not the history.
COUNT_CAP = 500
VERSIONS_MAX = 200  # (agent, version) pairs listed at most


def carried() -> dict[str, str]:
    """``{agent name: deployed version}`` of the agents this process has (RUNTIME_AGENTS)."""
    return {name: agent.deployed_version for name, agent in registry().items()}


def fleet() -> set[Pair]:
    """The (agent, version) pairs the live workers carry (every registration read; there
    are few). Live as the Workers page, ``runtime_workers`` and the metric say: not stopped,
    and heard from within ``inventory.stale_after()`` (two lease periods)."""
    since = timezone.now() - inventory.stale_after()
    rows = WorkerProcess.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=since)
    return {
        (str(name), str(version))
        for agents in rows.values_list("agents", flat=True)
        if isinstance(agents, dict)
        for name, version in agents.items()
    }


def _pairs(pairs: Iterable[Pair]) -> Q:
    return functools.reduce(
        operator.or_, (Q(agent=a, agent_version=v) for a, v in sorted(pairs)), Q(pk__in=[])
    )


@dataclass(frozen=True, slots=True)
class Claimable:
    """The runs a worker carrying ``mine`` may claim while the live workers carry ``live``
    (``runtime.domain.versions.claimable`` as a condition on the runs table)."""

    mine: dict[str, str]
    live: frozenset[Pair]
    routing: Routing

    @classmethod
    def now(cls) -> Claimable:
        """The condition for this process, read from the registrations now."""
        return cls(carried(), frozenset(fleet()), conf.agent_version_routing())

    def q(self) -> Q:
        """The condition as an ORM filter on Run."""
        allowed = Q(agent_version="") | _pairs(self.mine.items())
        if self.routing is Routing.DRAIN:
            allowed |= ~_pairs(self.live)
        return Q(agent__in=sorted(self.mine)) & allowed

    def sql(self) -> tuple[str, list[Any]]:
        """The condition as SQL on the runs table's columns, with its parameters."""
        pair = "(agent = %s AND agent_version = %s)"
        mine, live = sorted(self.mine.items()), sorted(self.live)
        allowed = " OR ".join(["agent_version = ''"] + [pair] * len(mine))
        if self.routing is Routing.DRAIN:
            allowed += f" OR NOT ({' OR '.join(['FALSE'] + [pair] * len(live))})"
        else:
            live = []
        params = [sorted(self.mine), *(x for p in mine for x in p), *(x for p in live for x in p)]
        return f"agent = ANY(%s) AND ({allowed})", params


def no_worker(run: Run) -> str:
    """Why no live worker may drive the Running ``run`` ("" when one may)."""
    return reasons([run]).get(run.id, "")


def reasons(runs: Iterable[Run]) -> dict[str, str]:
    """``{run id: why no live worker may drive it}`` for the Running, unpaused ``runs`` that
    no live worker may drive (a page of runs): one read of the registrations for them all."""
    running = [r for r in runs if r.state == "running" and not r.paused]
    if not running:
        return {}
    live, routing = fleet(), conf.agent_version_routing()
    found = {r.id: no_worker_reason(r.agent, r.agent_version, live, routing) for r in running}
    return {run_id: reason for run_id, reason in found.items() if reason}


def open_versions(agent: str | None = None) -> list[Pair]:
    """The (agent, version) pairs the runs not ended are on (of ``agent`` alone when given),
    sorted, at most VERSIONS_MAX.

    On PostgreSQL a loose scan of index run_open_version: one index probe per pair, never a
    read of every run in flight. On SQLite (the embedded database's sizes) a DISTINCT."""
    if connection.vendor != "postgresql":
        rows = Run.objects.filter(state__in=OPEN)
        if agent is not None:
            rows = rows.filter(agent=agent)
        pairs = rows.values_list("agent", "agent_version").distinct()
        return list(pairs.order_by("agent", "agent_version")[:VERSIONS_MAX])
    table, probe, params = Run._meta.db_table, "state IN (%s, %s)", list(OPEN)
    if agent is not None:
        probe, params = f"{probe} AND agent = %s", [*params, agent]
    sql = f"""
        WITH RECURSIVE pairs AS (
            (SELECT agent, agent_version FROM {table} WHERE {probe}
             ORDER BY agent, agent_version LIMIT 1)
            UNION ALL
            SELECT later.agent, later.agent_version FROM pairs CROSS JOIN LATERAL (
                SELECT agent, agent_version FROM {table}
                WHERE {probe} AND (agent, agent_version) > (pairs.agent, pairs.agent_version)
                ORDER BY agent, agent_version LIMIT 1
            ) AS later
        )
        SELECT agent, agent_version FROM pairs LIMIT %s"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *params, VERSIONS_MAX])
        return [(agent, version) for agent, version in cursor.fetchall()]


def capped_count(rows: QuerySet) -> int:
    """How many of ``rows`` there are, counted up to COUNT_CAP."""
    return rows[:COUNT_CAP].count()


def versions_in_flight() -> list[tuple[str, str, int]]:
    """``(agent, version, runs)`` for each version runs not ended are on (``runs`` counted
    up to COUNT_CAP): what deploys leave behind, for moving runs (issue 34, item 3)."""
    return [
        (
            agent,
            version,
            capped_count(Run.objects.filter(agent=agent, agent_version=version, state__in=OPEN)),
        )
        for agent, version in open_versions()
    ]


def without_a_worker() -> list[tuple[str, str, int, str]]:
    """``(agent, version, runs, reason)`` for each (agent, version) of the Running, unpaused
    runs that no live worker may drive (a metric and the Workers page; ``runs`` counted up to
    COUNT_CAP). Reads the registrations, the versions runs are on (``open_versions``) and the
    runs of the versions no live worker may drive alone."""
    live, routing = fleet(), conf.agent_version_routing()
    found = []
    for agent, version in open_versions():
        reason = no_worker_reason(agent, version, live, routing)
        if not reason:
            continue
        running = Run.objects.filter(agent=agent, agent_version=version, state="running")
        if runs := capped_count(running.filter(paused=False)):
            found.append((agent, version, runs, reason))
    return found
