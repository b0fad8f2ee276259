"""What the peers of ``bench/inflight.py`` share: one streamed inference with ``AsyncOpenAI``,
the async ledger, the command line and the report.

The agent shape (the one ``bench/inflight_agent.py`` runs on our runtime): a system message and
a user message unique per run; the model server answers with three ``ledger`` tool calls, each
is executed (one row written, keyed by ``<run id>:<call id>``), and the second answer is text.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any, cast

from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

try:  # the openai SDK's HTTP client: httpx2 from openai 3, httpx before
    from httpx2 import Limits
except ImportError:
    from httpx import Limits  # type: ignore[assignment]

INSTRUCTIONS = "Record the keys you are asked to record with the ledger tool."
LEDGER_TABLE = "bench_inflight_ledger"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ledger",
            "description": "Record an amount under a key, once per operation id.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "amount": {"type": "integer"}},
                "required": ["key"],
                "additionalProperties": False,
            },
        },
    }
]


def prompt() -> str:
    """A user message unique to one run (the model server tells conversations apart by it)."""
    return f"Record k0, k1 and k2 in the ledger. (run {uuid.uuid4().hex})"


def client(base_url: str, runs: int) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` client allowed one connection per run in flight (the SDK's default
    cap is 1,000 connections), never retrying (as our provider)."""
    limits = Limits(max_connections=runs + 10, max_keepalive_connections=runs + 10)
    return AsyncOpenAI(
        base_url=base_url,
        api_key="not-needed",
        max_retries=0,
        timeout=300.0,
        http_client=DefaultAsyncHttpxClient(limits=limits),
    )


async def infer(openai: AsyncOpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed inference. Returns ``{"text": str, "tool_calls": [{"id", "name",
    "arguments": dict}]}``, the calls in the model's order."""
    stream = await openai.chat.completions.create(
        model="bench",
        messages=cast(Any, messages),  # plain dicts of the wire format
        tools=cast(Any, TOOLS),
        stream=True,
        stream_options={"include_usage": True},
    )
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for wire in delta.tool_calls or []:
                call = calls.setdefault(wire.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = wire.id or call["id"]
                if wire.function is not None:
                    call["name"] = wire.function.name or call["name"]
                    call["arguments"] += wire.function.arguments or ""
    return {
        "text": "".join(text),
        "tool_calls": [
            {**calls[i], "arguments": json.loads(calls[i]["arguments"] or "{}")}
            for i in sorted(calls)
        ],
    }


def assistant_message(reply: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions message of ``infer``'s reply, for the next request."""
    message: dict[str, Any] = {"role": "assistant", "content": reply["text"] or None}
    if reply["tool_calls"]:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in reply["tool_calls"]
        ]
    return message


async def create_ledger(db: AsyncConnection[Any]) -> None:
    await db.execute(
        f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ("
        " id bigserial PRIMARY KEY,"
        " operation_id varchar(100) NOT NULL UNIQUE,"
        " key varchar(200) NOT NULL,"
        " tool varchar(100) NOT NULL,"
        " run_id varchar(64) NOT NULL,"
        " applied integer NOT NULL DEFAULT 1 CHECK (applied >= 0),"
        " created_at timestamptz NOT NULL DEFAULT now())"
    )
    await db.execute(f"CREATE INDEX IF NOT EXISTS {LEDGER_TABLE}_run ON {LEDGER_TABLE} (run_id)")


async def apply(
    pool: AsyncConnectionPool[Any], operation_id: str, call: dict[str, Any], run_id: str
) -> dict[str, Any]:
    """The ledger tool: one row per ``operation_id`` (a repeat counts in ``applied``)."""
    async with pool.connection() as db:
        await db.execute(
            f"INSERT INTO {LEDGER_TABLE} (operation_id, key, tool, run_id)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (operation_id)"
            f" DO UPDATE SET applied = {LEDGER_TABLE}.applied + 1",
            (operation_id, call["arguments"]["key"], call["name"], run_id),
        )
    return {"recorded": call["arguments"]["key"], "operation_id": operation_id}


async def check_ledger(pool: AsyncConnectionPool[Any], run_ids: list[str], calls: int) -> None:
    """SystemExit unless every run has ``calls`` rows, each applied once."""
    async with pool.connection() as db, db.cursor(row_factory=tuple_row) as cursor:
        await cursor.execute(
            f"SELECT count(*), min(applied), max(applied) FROM {LEDGER_TABLE}"
            " WHERE run_id = ANY(%s)",
            (run_ids,),
        )
        found = await cursor.fetchone()
    assert found is not None  # an aggregate has its one row
    rows, low, high = found
    if (rows, low, high) != (calls * len(run_ids), 1, 1):
        raise SystemExit(
            f"wrong outcome: {rows} ledger rows for {len(run_ids)} runs, applied {low}..{high}"
        )


def parser(description: str) -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=description)
    options.add_argument("--runs", type=int, required=True, help="runs, all started at once")
    options.add_argument("--model-url", required=True, help="the model server's /v1 URL")
    options.add_argument("--database-url", required=True, help="postgresql:// URL")
    options.add_argument("--pool-size", type=int, default=10, help="database connections")
    options.add_argument("--tool-calls", type=int, default=3, help="calls the model answers")
    return options


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM of /proc/self/status), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def report(name: str, runs: int, started: float, ended: float) -> None:
    """Print one JSON line: ``{"system", "runs", "started", "ended" (time.time() seconds of
    the first start and the last result), "seconds", "peak_rss_mib"}``."""
    result = {
        "system": name,
        "runs": runs,
        "started": started,
        "ended": ended,
        "seconds": ended - started,
        "peak_rss_mib": peak_rss_mib(),
    }
    print(json.dumps(result), flush=True)


now = time.time  # wall-clock seconds, comparable with the model server's records
