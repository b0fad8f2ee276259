"""``bench/inflight.py``'s agent shape on DBOS Transact, every run in flight at once.

One async workflow per run (``@DBOS.workflow()`` on ``async def``), one async step per
inference (a streamed ``AsyncOpenAI`` request to the bench's model server) and one per tool call
(its ledger row, written through a psycopg ``AsyncConnectionPool`` of ``--pool-size``
connections, default 10). All ``--runs`` workflows are started at once with
``DBOS.start_workflow_async`` and awaited. DBOS keeps its system tables in the database of
``--database-url`` (its own, on the bench's PostgreSQL server; its pool is DBOS's default).

    cd bench && python -m peers.inflight_dbos --runs 100 \\
        --model-url http://127.0.0.1:8400/v1 --database-url postgresql://.../inflight_dbos

Prints one JSON line (``inflight_common.report``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from dbos import DBOS, DBOSConfig
from openai import AsyncOpenAI
from psycopg_pool import AsyncConnectionPool

from peers.inflight_common import (
    INSTRUCTIONS,
    apply,
    assistant_message,
    check_ledger,
    client,
    create_ledger,
    infer,
    now,
    parser,
    prompt,
    report,
)

STEP_LIMIT = 4
# Set in run() before DBOS launches; the steps use them.
openai: AsyncOpenAI | None = None
pool: AsyncConnectionPool[Any] | None = None


@DBOS.step()
async def inference(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed inference (its output is recorded by DBOS)."""
    assert openai is not None
    return await infer(openai, messages)


@DBOS.step()
async def ledger(operation_id: str, call: dict[str, Any], run_id: str) -> dict[str, Any]:
    """One ledger tool call, keyed by ``<workflow id>:<call id>``."""
    assert pool is not None
    return await apply(pool, operation_id, call, run_id)


@DBOS.workflow()
async def agent_run(text: str) -> str:
    """The agent loop: infer, run every tool call in order, infer again until text."""
    run_id = DBOS.workflow_id
    assert run_id is not None
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": text},
    ]
    for _ in range(STEP_LIMIT):
        reply = await inference(messages)
        messages.append(assistant_message(reply))
        if not reply["tool_calls"]:
            return run_id
        for call in reply["tool_calls"]:
            result = await ledger(f"{run_id}:{call['id']}", call, run_id)
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
    raise RuntimeError("step limit reached")


async def run(args: Any) -> None:
    global openai, pool
    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "inflight-bench",
        "system_database_url": args.database_url,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    pool = AsyncConnectionPool(
        args.database_url,
        min_size=args.pool_size,
        max_size=args.pool_size,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open(wait=True)
    openai = client(args.model_url, args.runs)
    try:
        async with pool.connection() as db:
            await create_ledger(db)
        started = now()
        handles = await asyncio.gather(
            *(DBOS.start_workflow_async(agent_run, prompt()) for _ in range(args.runs))
        )
        run_ids = await asyncio.gather(*(handle.get_result() for handle in handles))
        ended = now()
        await check_ledger(pool, list(run_ids), args.tool_calls)
    finally:
        await openai.close()
        await pool.close()
        DBOS.destroy()
    report("dbos", args.runs, started, ended)


def main() -> None:
    asyncio.run(run(parser(__doc__.splitlines()[0]).parse_args()))


if __name__ == "__main__":
    main()
