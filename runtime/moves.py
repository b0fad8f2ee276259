"""Moving runs to the deployed version of their agent on purpose (issue 34, item 3).

A dry run first: for each run that is not ended and not on the version this process carries,
``plan`` says what moving it changes, from its committed state and this process's code. A
call waiting for an approval, an input or a timer whose tool is gone, or whose arguments the
tool's current schema refuses, will be completed with an error result before any effect; a
call whose effect may have started (Executing) is recovered by its pinned policy when the
tool is gone; a call whose tool declares another policy, permission, budget or effects now
keeps what was pinned. Then what the run does next. A run a worker drives now is listed as
not movable (pause it first).

``move`` applies a plan run by run (``operations.move_run``: one committed ``RunMoved`` each,
in Audit). The target is always the version of the agent this process carries: run the
dry run and the move from a process of the new deploy (its CLI, its API).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q

from runtime import codec, operations, versions
from runtime.agents import Agent, get_agent
from runtime.db import db_now
from runtime.domain.model import CallPhase, RunState, RunView, TicketKind, ToolCall
from runtime.errors import MoveRefused
from runtime.loop.execute import runnable
from runtime.models import Run

PAGE = 100  # runs one plan lists at most (``more`` says when others match)
PAGE_MAX = 1000
# A call waiting on one of these is completed by its answer (an input, a child's end): no tool
# runs for it, so the new code's tools do not matter to it.
ANSWERED_KINDS = (TicketKind.INPUT, TicketKind.DELEGATION)


@dataclass(frozen=True, slots=True)
class Move:
    """What moving one run to ``to_version`` changes: ``changes`` (one line per call it
    touches), ``next`` (what the run does next on the new version) and ``refused`` (why it
    cannot be moved now; "" when it can)."""

    run_id: str
    agent: str
    from_version: str
    to_version: str
    state: str
    paused: bool
    changes: tuple[str, ...]
    next: str
    refused: str = ""

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "changes": list(self.changes)}


def plan(
    agent: str,
    *,
    from_version: str | None = None,
    run_ids: list[str] | None = None,
    limit: int = PAGE,
) -> tuple[str, list[Move], bool]:
    """The dry run of moving ``agent``'s runs (those on ``from_version`` when given, those of
    ``run_ids`` when given) to the version this process carries: ``(to_version, moves,
    more)``, at most ``limit`` (1 to PAGE_MAX) of them, by version then oldest first; ``more``
    is True when further runs match. Reads the versions runs are on and then at most
    ``limit + 1`` runs not ended (index run_open_version).

    Raises UnknownAgent when this process does not carry ``agent``; ValueError for a
    ``limit`` out of range."""
    if not 1 <= limit <= PAGE_MAX:
        raise ValueError(f"limit is 1 to {PAGE_MAX}")
    definition = get_agent(agent)
    to_version = definition.deployed_version
    if from_version is None:
        wanted = [v for _, v in versions.open_versions(agent) if v != to_version]
    else:
        wanted = [from_version] if from_version != to_version else []
    # A live lease is judged by the database's clock, as every lease is (runtime.db).
    held = ExpressionWrapper(Q(lease_expires_at__gt=db_now()), output_field=BooleanField())
    found: list[Run] = []
    for version in wanted:
        rows = Run.objects.filter(agent=agent, agent_version=version, state__in=versions.OPEN)
        if run_ids is not None:
            rows = rows.filter(id__in=run_ids)
        rows = rows.order_by("created_at", "id").only(
            "id", "agent", "agent_version", "snapshot", "lease_owner"
        )
        found += rows.annotate(held=held)[: limit + 1 - len(found)]
        if len(found) > limit:
            break
    moves = [_move(row, definition, to_version) for row in found[:limit]]
    return to_version, moves, len(found) > limit


def move(
    agent: str,
    *,
    from_version: str | None = None,
    run_ids: list[str] | None = None,
    limit: int = PAGE,
    actor: str = "",
    reason: str = "",
) -> tuple[str, list[Move], list[str], bool]:
    """Move the runs ``plan`` finds and can move: ``(to_version, moves, moved, more)`` with
    the ids of the runs moved. A run refused meanwhile (a worker claimed it, another
    operator moved it) keeps its version and its Move says why. Raises what ``plan``
    raises, and InvalidCommit for a reason no surface may record."""
    to_version, moves, more = plan(agent, from_version=from_version, run_ids=run_ids, limit=limit)
    moved, result = [], []
    for m in moves:
        if not m.refused:
            try:
                operations.move_run(
                    m.run_id,
                    from_version=m.from_version,
                    to_version=to_version,
                    actor=actor,
                    reason=reason,
                )
                moved.append(m.run_id)
            except MoveRefused as refused:
                m = Move(**{**asdict(m), "refused": refused.message})
        result.append(m)
    return to_version, result, moved, more


def _move(row: Run, agent: Agent, to_version: str) -> Move:
    run = codec.load_run(row.snapshot)
    answered = {t.id for t in (run.ticket, *run.waits) if t and t.kind in ANSWERED_KINDS}
    changes = tuple(
        line
        for call in _pending(run)
        if call.ticket_id not in answered and (line := _change(agent, call))
    )
    held = row.held  # type: ignore[attr-defined]  # the annotation of plan()
    refused = operations.driven_now(row.lease_owner or "") if held else ""
    return Move(
        run_id=row.id,
        agent=row.agent,
        from_version=row.agent_version,
        to_version=to_version,
        state=run.state.value,
        paused=run.paused,
        changes=changes,
        next=_next(run, to_version),
        refused=refused,
    )


def _pending(run: RunView) -> list[ToolCall]:
    batch = run.open_batch
    return [c for c in batch.calls if not c.phase.terminal] if batch else []


def _label(call: ToolCall) -> str:
    return f"call {call.index} {call.name} ({call.phase.value})"


def _change(agent: Agent, call: ToolCall) -> str:
    """What the new code does to ``call`` ("" when nothing differs that it can see)."""
    ready = runnable(agent, call)
    if isinstance(ready, str):
        if call.phase is CallPhase.EXECUTING:
            return (
                f"{_label(call)}: {ready}; its effect may have started, so its pinned policy"
                f" {call.policy.value} recovers it (a once effect becomes Indeterminate)"
            )
        if call.phase is CallPhase.AWAITING:  # its ticket stays open: answer it, or deny it
            return (
                f"{_label(call)}: its ticket stays open; once answered, the call is completed"
                f" as an error before any effect: Not run: {ready}"
            )
        return f"{_label(call)}: completed as an error before any effect: Not run: {ready}"
    tool = ready[0]
    pinned = (call.policy, call.permission, call.max_attempts, call.effects)
    now = (tool.policy, agent.permission_for(tool), tool.max_attempts, tool.effects)
    if pinned == now:
        return ""
    return (
        f"{_label(call)}: keeps what was pinned when it was requested (policy"
        f" {call.policy.value}, permission {call.permission.value}, {call.max_attempts}"
        f" attempt(s), effects {call.effects.value}); the new version declares policy"
        f" {tool.policy.value}, permission {agent.permission_for(tool).value},"
        f" {tool.max_attempts} attempt(s), effects {tool.effects.value} for later calls"
    )


def _next(run: RunView, to_version: str) -> str:
    """What the run does next once moved."""
    prefix = "stays paused until an operator resumes it; then it " if run.paused else "it "
    if run.state is RunState.AWAITING and run.ticket is not None:
        call = run.find_call(run.ticket.call_id)
        what = f" of call {call.index} {call.name}" if call else ""
        kind = run.ticket.kind.value
        return f"{prefix}waits for its {kind} ticket{what}; version {to_version} goes on from it"
    pending = _pending(run)
    if pending:
        first = pending[0]
        return f"{prefix}runs call {first.index} {first.name} next, under version {to_version}"
    return f"{prefix}asks the model next, with version {to_version}'s instructions and tools"
