"""Torn-read detection: is a run document exactly the fold of its log at its ``version``?

The log is append-only, so folding the commits with sequence <= the document's version, read
at any later time, gives the state the document claims to show. Any difference means the
document mixed commits (issue 12, item 1). Used by tests/runtime/test_snapshot.py and by the
chaos run (tests/chaos/chaos.py).
"""

from __future__ import annotations

from typing import Any

from runtime.domain.commit import fold
from runtime.fsck import read_log


def _calls(batches: Any, *, folded: bool) -> list[tuple[Any, ...]]:
    out = []
    for batch in batches:
        calls = batch.calls if folded else batch["calls"]
        step, finalized = (
            (batch.step, batch.finalized) if folded else (batch["step"], batch["finalized"])
        )
        for c in calls:
            if folded:
                row = (c.call_id, c.phase.value, c.attempt, c.approved, c.result, c.is_error)
            else:
                row = (
                    c["call_id"],
                    c["phase"],
                    c["attempt"],
                    c["approved"],
                    c["result"],
                    c["is_error"],
                )
            out.append((step, finalized, *row))
    return out


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The parts of a run document that a fold determines."""
    ticket = document["ticket"]
    return {
        "state": document["state"],
        "end_cause": document["end_cause"],
        "step": document["step"],
        "version": document["version"],
        "ticket": ticket and (ticket["id"], ticket["kind"], ticket["call_id"]),
        "calls": _calls(document["batches"], folded=False),
        "messages": [
            (m["seq"], m["role"], m["content"], m["tool_call_id"]) for m in document["messages"]
        ],
    }


def expected(document: dict[str, Any]) -> dict[str, Any] | None:
    """What the fold of the run's log up to the document's version says (None: no run)."""
    log = [(s, d) for s, d in read_log(document["thread_id"]) if s <= document["version"]]
    state = fold(document["thread_id"], log)
    run = state.runs.get(document["id"])
    if run is None:
        return None
    ticket = run.ticket
    return {
        "state": run.state.value,
        "end_cause": run.end_cause.value if run.end_cause else None,
        "step": run.step,
        "version": run.version,
        "ticket": ticket and (ticket.id, ticket.kind.value, ticket.call_id),
        "calls": _calls(run.batches, folded=True),
        "messages": [
            (seq, m.role, m.content, m.tool_call_id)
            for seq, run_id, m in state.messages
            if run_id == document["id"]
        ],
    }


def torn(document: dict[str, Any]) -> str | None:
    """Describe how ``document`` differs from the fold at its version, or return None."""
    want, got = expected(document), comparable(document)
    if want == got:
        return None
    if want is None:
        return f"run {document['id']}: no run at version {document['version']}"
    diff = {k: (got[k], want[k]) for k in got if got[k] != want[k]}
    return f"run {document['id']} at version {document['version']}: (shown, folded) {diff}"
