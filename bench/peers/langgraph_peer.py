"""The demo workload on LangGraph: a StateGraph with a model node and a tools node, checkpointed
by ``PostgresSaver`` with durability "sync" (each step's checkpoint is written before the next
step starts), on the same PostgreSQL.

The tools node runs the Step's calls one after another, as our loop does, each writing its
ledger row keyed by ``<thread id>:<tool call id>``. ``--threads T`` threads each invoke the
compiled graph on a new thread id; the checkpointer shares a pool of T connections.

    cd bench && DATABASE_URL=postgres://... python -m peers.langgraph_peer --runs 100 --threads 4

Prints one JSON line: runs/s (wall time of the timed runs) and new sessions per run.
"""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from psycopg import Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from peers.workload import (
    PROMPT,
    Ledger,
    database_url,
    measure,
    parser,
    report,
    scripted_reply,
    threaded,
)

LEDGER_TABLE = "bench_langgraph_ledger"


def build(ledger: Ledger, checkpointer: PostgresSaver) -> Any:
    """Compile the agent graph: START -> model -> (tools -> model)* -> END."""

    def model(state: MessagesState) -> dict[str, list[Any]]:
        step = sum(isinstance(m, AIMessage) for m in state["messages"])
        reply = scripted_reply(step)
        calls = [
            {"id": c["id"], "name": c["name"], "args": c["arguments"], "type": "tool_call"}
            for c in reply["tool_calls"]
        ]
        return {"messages": [AIMessage(content=reply["text"], tool_calls=calls)]}

    def tools(state: MessagesState, config: RunnableConfig) -> dict[str, list[Any]]:
        thread_id = config["configurable"]["thread_id"]
        results = []
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)  # the model node's reply
        for call in last.tool_calls:
            result = ledger.apply(
                f"{thread_id}:{call['id']}", call["args"]["key"], call["name"], thread_id
            )
            results.append(ToolMessage(content=str(result), tool_call_id=call["id"]))
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
    return graph.compile(checkpointer=checkpointer)


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    ledger = Ledger(LEDGER_TABLE, args.threads)
    pool: ConnectionPool[Connection[DictRow]] = ConnectionPool(
        database_url(),
        connection_class=Connection[DictRow],
        min_size=args.threads,
        max_size=args.threads,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    try:
        checkpointer = PostgresSaver(pool)
        checkpointer.setup()
        graph = build(ledger, checkpointer)

        def run_one() -> str:
            thread_id = uuid.uuid4().hex
            graph.invoke(
                {"messages": [HumanMessage(content=PROMPT)]},
                {"configurable": {"thread_id": thread_id}},
                durability="sync",
            )
            return thread_id

        result = measure(threaded(run_one, args.threads), ledger, args.runs, args.warmup)
    finally:
        pool.close()
        ledger.close()
    report({"peer": "langgraph", "threads": args.threads, **result})


if __name__ == "__main__":
    main()
