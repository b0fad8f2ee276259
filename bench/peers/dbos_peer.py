"""The demo workload on DBOS Transact: one workflow per run, one step per inference and per
tool call (five steps), its system database on the same PostgreSQL.

Two ways to run it:

- direct: ``--threads T`` threads each call the workflow function (DBOS records the workflow
  and every step's output in its system database as it goes);
- ``--queue``: the runs are enqueued on a DBOS queue and this process's queue worker runs
  them, at most ``--threads`` at once (``worker_concurrency``): the queue-to-queue comparison
  with our workers. The queue is polled every ``--poll`` seconds (DBOS's default is 1 s; the
  default here, 0.01 s, is in DBOS's favour).

    cd bench && DATABASE_URL=postgres://... python -m peers.dbos_peer --runs 100 --threads 4

Prints one JSON line: runs/s (wall time of the timed runs) and new sessions per run.
"""

from __future__ import annotations

import logging
from typing import Any

from dbos import DBOS, DBOSConfig

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

LEDGER_TABLE = "bench_dbos_ledger"
QUEUE = "bench_runs"
ledger: Ledger | None = None  # set in main(), used by the ledger step


@DBOS.step()
def infer(step: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One inference of the scripted model (``messages`` is the request it would send)."""
    return scripted_reply(step)


@DBOS.step()
def call_tool(operation_id: str, name: str, key: str, run_id: str) -> dict[str, str]:
    """One ledger tool call: the demo tools' effect, keyed by the step's operation id."""
    assert ledger is not None
    return ledger.apply(operation_id, key, name, run_id)


@DBOS.workflow()
def agent_run(prompt: str) -> str:
    """The agent loop: infer, run every tool call, infer again until a text-only answer."""
    run_id = DBOS.workflow_id
    assert run_id is not None
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for step in range(8):
        reply = infer(step, messages)
        messages.append({"role": "assistant", **reply})
        if not reply["tool_calls"]:
            return run_id
        for call in reply["tool_calls"]:
            operation_id = f"{run_id}:{call['id']}"
            result = call_tool(operation_id, call["name"], call["arguments"]["key"], run_id)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise RuntimeError("step limit reached")


def queued(queue_name: str, poll: float) -> Any:
    """A Batch that enqueues ``count`` runs and waits for all of them (looking every ``poll``
    seconds, so that noticing the end adds little to the wall time)."""

    def batch(count: int) -> list[str]:
        queue = DBOS.retrieve_queue(queue_name)
        assert queue is not None, f"no DBOS queue {queue_name}"
        handles = [queue.enqueue(agent_run, PROMPT) for _ in range(count)]
        return [handle.get_result(polling_interval_sec=poll) for handle in handles]

    return batch


def main() -> None:
    global ledger
    options = parser(__doc__.splitlines()[0])
    options.add_argument("--queue", action="store_true", help="run through a DBOS queue")
    options.add_argument("--poll", type=float, default=0.01, help="queue polling interval, s")
    args = options.parse_args()

    logging.getLogger("dbos").setLevel(logging.WARNING)
    config: DBOSConfig = {
        "name": "runtime-bench",
        "system_database_url": database_url(),
        "log_level": "WARNING",
        "max_executor_threads": max(8, args.threads * 2),
    }
    DBOS(config=config)
    DBOS.launch()
    ledger = Ledger(LEDGER_TABLE, args.threads)
    try:
        if args.queue:
            DBOS.register_queue(
                QUEUE,
                worker_concurrency=args.threads,
                polling_interval_sec=args.poll,
                on_conflict="always_update",
            )
            batch = queued(QUEUE, args.poll)
        else:
            batch = threaded(lambda: agent_run(PROMPT), args.threads)
        result = measure(batch, ledger, args.runs, args.warmup)
    finally:
        ledger.close()
        DBOS.destroy()
    report({"peer": "dbos", "queue": args.queue, "threads": args.threads, **result})


if __name__ == "__main__":
    main()
