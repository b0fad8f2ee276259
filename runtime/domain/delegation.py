"""Pure rules of terminal-only child delegation and of where a run waits.

A delegate call waits on its child with a ticket of kind ``delegation`` that does not hold the
calls after it back (seed: "Terminal-only child delegation may run concurrently"). The run
stays Running while any other call can proceed, and waits (Awaiting, holding no worker) on the
first open delegation ticket only when nothing else can (``settle``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.domain.model import Disposition, EndCause, RunState, RunView, ToolCall
from runtime.errors import DelegationRefused


@dataclass(frozen=True, slots=True)
class DeliverToParent:
    """Owed by a child Run's Ended commit: its terminus goes to the parent's delegate call."""

    child: RunView


@dataclass(frozen=True, slots=True)
class CancelChild:
    """Owed by a parent Run's Ended commit: its live child is cancelled."""

    child_run_id: str
    parent_run_id: str
    cause: str  # the parent's end cause, named in the child's end


FollowUp = DeliverToParent | CancelChild


def follow_ups(before: RunView | None, run: RunView | None) -> tuple[FollowUp, ...]:
    """What a commit that leaves ``run`` (from ``before``) owes other Runs, in the same
    transaction (DESIGN.md, "Lower layers never call up"): the delivery of a child's terminus
    to its parent, and the cancellation of a parent's live children. None unless the commit
    ends the run."""
    if run is None or run.state is not RunState.ENDED:
        return ()
    if before is not None and before.state is RunState.ENDED:
        return ()
    owed: list[FollowUp] = []
    if run.parent_run_id is not None:
        owed.append(DeliverToParent(run))
    if before is not None:
        cause = run.end_cause.value if run.end_cause else "ended"
        owed.extend(
            CancelChild(call.child_run_id, run.run_id, cause)
            for batch in before.batches
            for call in batch.calls
            if call.detached and call.child_run_id
        )
    return tuple(owed)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildLink:
    """Where a child Run comes from: its own id (derived from the call's operation id), its
    parent run, the delegate call it answers and its depth."""

    run_id: str
    parent_run_id: str
    parent_call_id: str
    depth: int


def settle(run: RunView) -> Disposition:
    """The disposition a commit leaves ``run`` in (``run`` with the commit's events applied).

    Awaiting on its own ticket while it holds one; Awaiting on its first delegation ticket
    when every call of the open batch is terminal or awaits a child; else Running.
    """
    if run.ticket is not None:
        return Disposition.awaiting(run.ticket)
    batch = run.open_batch
    if batch is not None and run.waits and all(c.phase.terminal or c.detached for c in batch.calls):
        return Disposition.awaiting(run.waits[0])
    return Disposition.running()


def check_limits(
    run: RunView, call: ToolCall, delegates: tuple[str, ...], max_depth: int, max_children: int
) -> None:
    """Refuse a delegate call beyond the limits; ``delegates`` names the agent's delegate tools.

    Raises DelegationRefused when a child would be deeper than ``max_depth`` or when the call
    is beyond the first ``max_children`` delegate calls of its batch (settings
    RUNTIME_DELEGATION_MAX_DEPTH and RUNTIME_DELEGATION_MAX_CHILDREN).
    """
    if run.depth + 1 > max_depth:
        raise DelegationRefused(
            f"delegation refused: a child would have depth {run.depth + 1}, "
            f"beyond the limit {max_depth}",
            limit="depth",
        )
    batch = run.open_batch
    earlier = [c for c in (batch.calls if batch else ()) if c.name in delegates]
    position = next((i for i, c in enumerate(earlier) if c.call_id == call.call_id), 0)
    if position + 1 > max_children:
        raise DelegationRefused(
            f"delegation refused: at most {max_children} delegate calls per batch",
            limit="children",
        )


def terminus_text(child_run_id: str, agent: str, cause: EndCause, error: object) -> str:
    """The error result a parent's call gets when its child ends other than naturally."""
    detail = ""
    if isinstance(error, dict) and (error.get("message") or error.get("reason")):
        detail = f": {error.get('message') or error.get('reason')}"
    return f"The child run {child_run_id} (agent {agent}) ended {cause.value}{detail}."
