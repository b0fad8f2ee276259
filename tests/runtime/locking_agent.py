"""A test agent whose tool's fenced effect waits on a lock (issue 29, item 2), loaded by worker
subprocesses through RUNTIME_AGENTS: ``locking``, the demo's tools and scripted model plus
``held_effect``, which holds its run's row (``ToolContext.fence``) while it waits for the
PostgreSQL advisory lock ``EFFECT_LOCK`` that a test holds, then records one ledger effect."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.utils import timezone

from runtime import db
from runtime.demo.agent import Key, demo
from runtime.demo.models import LedgerEffect
from runtime.domain.model import Effects, RecoveryPolicy
from runtime.tools import ToolContext, tool

AGENTS = "runtime.demo.agent.demo,tests.runtime.locking_agent.locking"
EFFECT_LOCK = 2929


@tool(policy=RecoveryPolicy.INDETERMINATE, effects=Effects.ONCE)
def held_effect(ctx: ToolContext, key: Key) -> dict[str, Any]:
    """Record a key once, in one transaction that holds the run's row from its fence on and
    waits for the downstream (the advisory lock) before it writes."""
    with db.atomic():
        ctx.fence()
        with db.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [EFFECT_LOCK])
        LedgerEffect.objects.create(
            operation_id=ctx.operation_id,
            key=key,
            tool="held_effect",
            run_id=ctx.run_id,
            applied=1,
            created_at=timezone.now(),
        )
    return {"recorded": key, "operation_id": ctx.operation_id}


locking = replace(demo, name="locking", tools=(*demo.tools, held_effect))
