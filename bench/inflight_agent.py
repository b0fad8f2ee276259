"""The agent ``bench/inflight.py`` runs on our runtime: a real OpenAI-compatible model (the
bench's ``model_server.py``) and one sync tool, ``ledger``, that writes one row per call.

Registered through ``RUNTIME_AGENTS`` as ``bench.inflight_agent.inflight`` (the bench sets the
variable for its own process and the workers; ``bench`` is found from the project root as a
namespace package). The model server's base URL is ``BENCH_MODEL_URL`` (e.g.
``http://127.0.0.1:8400/v1``), read when the agent is loaded.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from django.db import connection
from django.utils import timezone
from pydantic import Field

from runtime.agents import Agent, ProviderConfig
from runtime.demo.models import LedgerEffect
from runtime.domain.model import RecoveryPolicy
from runtime.tools import Fenced, ToolContext, tool

NAME = "inflight"
TOOL = "ledger"
MODEL_URL_ENV = "BENCH_MODEL_URL"


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=3, name=TOOL)
def ledger(
    ctx: ToolContext,
    key: Annotated[str, Field(min_length=1, max_length=200)],
    amount: Annotated[int, Field(ge=0)] = 1,
) -> dict[str, Any]:
    """Record an amount under a key, once per operation id (safe to replay).

    One statement, as the demo ledger writes it: an upsert of the demo ``LedgerEffect`` row
    keyed by the call's operation id, fenced on this worker's claim of the run (it lands only
    while the claim owns the run) and counting repeated applications in ``applied``.
    """
    table = connection.ops.quote_name(LedgerEffect._meta.db_table)
    fence, params = ctx.fence_sql()
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH fence AS ({fence}) "
            f"INSERT INTO {table} (operation_id, key, tool, run_id, applied, created_at) "
            "SELECT %s, %s, %s, %s, 1, %s FROM fence WHERE true "
            f"ON CONFLICT (operation_id) DO UPDATE SET applied = {table}.applied + 1 "
            "RETURNING operation_id",
            [*params, ctx.operation_id, key, TOOL, ctx.run_id, timezone.now()],
        )
        if cursor.fetchone() is None:
            raise Fenced(f"run {ctx.run_id} is no longer owned by lease {ctx.lease_epoch}")
    return {"recorded": key, "amount": amount, "operation_id": ctx.operation_id}


def inflight() -> Agent:
    """The agent, its model server's URL read from ``BENCH_MODEL_URL`` now."""
    return Agent(
        name=NAME,
        description="bench/inflight.py: a streamed model answer of tool calls, then text.",
        instructions="Record the keys you are asked to record with the ledger tool.",
        tools=(ledger,),
        provider=ProviderConfig(
            kind="openai",
            model="bench",
            base_url=os.environ.get(MODEL_URL_ENV, "http://127.0.0.1:8400/v1"),
            timeout=300.0,
        ),
        step_limit=4,
    )
