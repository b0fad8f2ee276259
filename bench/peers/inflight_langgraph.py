"""``bench/inflight.py``'s agent shape on LangGraph, every run in flight at once.

An async ``StateGraph``: a model node (one streamed ``AsyncOpenAI`` inference against the
bench's model server) and a tools node (the answer's calls one after another, each writing its
ledger row), checkpointed by ``AsyncPostgresSaver`` with durability "sync" on a psycopg
``AsyncConnectionPool`` of ``--pool-size`` connections (default 10) that the ledger writes
share. All ``--runs`` runs are invoked at once (``asyncio.gather``, one thread id each).

    cd bench && python -m peers.inflight_langgraph --runs 100 \\
        --model-url http://127.0.0.1:8400/v1 --database-url postgresql://.../inflight_langgraph

Prints one JSON line (``inflight_common.report``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from openai import AsyncOpenAI
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from peers.inflight_common import (
    INSTRUCTIONS,
    apply,
    check_ledger,
    client,
    create_ledger,
    infer,
    now,
    parser,
    prompt,
    report,
)


def wire(message: AnyMessage) -> dict[str, Any]:
    """A LangChain message as a chat-completions message."""
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                }
                for c in message.tool_calls
            ]
        return out
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    return {"role": "user", "content": message.content}


def build(openai: AsyncOpenAI, pool: AsyncConnectionPool[Any], saver: AsyncPostgresSaver) -> Any:
    """Compile the graph: START -> model -> (tools -> model)* -> END."""

    async def model(state: MessagesState) -> dict[str, list[Any]]:
        messages = [{"role": "system", "content": INSTRUCTIONS}]
        messages += [wire(m) for m in state["messages"]]
        reply = await infer(openai, messages)
        calls = [
            {"id": c["id"], "name": c["name"], "args": c["arguments"], "type": "tool_call"}
            for c in reply["tool_calls"]
        ]
        return {"messages": [AIMessage(content=reply["text"], tool_calls=calls)]}

    async def tools(state: MessagesState, config: RunnableConfig) -> dict[str, list[Any]]:
        thread_id = config["configurable"]["thread_id"]
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)  # the model node's reply
        results = []
        for call in last.tool_calls:
            wire_call = {"name": call["name"], "arguments": call["args"]}
            result = await apply(pool, f"{thread_id}:{call['id']}", wire_call, thread_id)
            results.append(ToolMessage(content=json.dumps(result), tool_call_id=call["id"]))
        return {"messages": results}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


async def run(args: Any) -> None:
    pool: AsyncConnectionPool[AsyncConnection[DictRow]] = AsyncConnectionPool(
        args.database_url,
        connection_class=AsyncConnection[DictRow],
        min_size=args.pool_size,
        max_size=args.pool_size,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    )
    await pool.open(wait=True)
    openai = client(args.model_url, args.runs)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        async with pool.connection() as db:
            await create_ledger(db)
        graph = build(openai, pool, saver)

        async def one() -> str:
            thread_id = uuid.uuid4().hex
            await graph.ainvoke(
                {"messages": [HumanMessage(content=prompt())]},
                {"configurable": {"thread_id": thread_id}},
                durability="sync",
            )
            return thread_id

        started = now()
        run_ids = await asyncio.gather(*(one() for _ in range(args.runs)))
        ended = now()
        await check_ledger(pool, list(run_ids), args.tool_calls)
    finally:
        await openai.close()
        await pool.close()
    report("langgraph", args.runs, started, ended)


def main() -> None:
    asyncio.run(run(parser(__doc__.splitlines()[0]).parse_args()))


if __name__ == "__main__":
    main()
