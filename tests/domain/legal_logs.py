"""A hypothesis strategy for random *legal* commit logs, and the small model that drives it.

At each move the model lists what the seed allows from where the thread is (the recovery
decision table: infer, open a batch, gate/execute/retry/await/complete/seal the first unfinished
call, answer the open ticket, finalize, end, reconcile, start a follow-up run) and hypothesis
picks one. The model keeps its own expectation of every run and call (``ShadowRun``), written
from the seed rather than from ``domain.commit``, so that the fold can be compared with it. Each
move is also validated with ``apply_commit`` as it is generated: a legal move it refuses fails
the test at that move.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from runtime.domain.commit import CommitDraft
from runtime.domain.model import (
    DECISIONS_FOR_KIND,
    CallPhase,
    Decision,
    EndCause,
    Permission,
    RecoveryPolicy,
    RunState,
    TicketKind,
    ToolCall,
)
from tests.domain import drafts
from tests.domain.drafts import Ids, Log


@dataclass
class ShadowCall:
    call_id: str
    tool_call_id: str
    permission: Permission
    policy: RecoveryPolicy
    max_attempts: int
    phase: CallPhase = CallPhase.REQUESTED
    attempt: int = 0
    approved: bool = False
    ticket_id: str | None = None
    is_error: bool = False
    started: bool = False  # an executor attempt was ever committed


@dataclass
class ShadowRun:
    run_id: str
    state: RunState = RunState.RUNNING
    end_cause: EndCause | None = None
    step: int = 0
    batches: list[list[ShadowCall]] = field(default_factory=list)
    finalized: list[bool] = field(default_factory=list)
    ticket: str | None = None
    ticket_kind: TicketKind | None = None
    consumed: list[str] = field(default_factory=list)

    @property
    def open_batch(self) -> list[ShadowCall] | None:
        return self.batches[-1] if self.batches and not self.finalized[-1] else None

    def first_unfinished(self) -> ShadowCall | None:
        batch = self.open_batch or []
        return next((c for c in batch if not c.phase.terminal), None)


@dataclass
class Scenario:
    thread_id: str
    commits: list[tuple[int, CommitDraft]]
    runs: dict[str, ShadowRun]
    active: str | None
    moves: list[str]
    published: list[tuple[str, ...]]  # tool_call_ids of each finalization, as published
    reconciliations: int = 0

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return f"Scenario(moves={self.moves})"


TERMINAL = (CallPhase.COMPLETED, CallPhase.INDETERMINATE)


def _options(runs: dict[str, ShadowRun], active: str | None) -> list[str]:
    """Every move the seed allows from here (names, in a fixed order for shrinking)."""
    sealed = any(
        c.phase is CallPhase.INDETERMINATE
        for run in runs.values()
        for batch in run.batches
        for c in batch
    )
    note = ["reconcile"] if sealed else []
    run = runs.get(active or "")
    if run is None or run.state is RunState.ENDED:
        return ["activate", *note]
    if run.state is RunState.AWAITING:
        assert run.ticket_kind is not None
        kinds = sorted(DECISIONS_FOR_KIND[run.ticket_kind])
        return [f"resume:{d.value}" for d in kinds] + ["end"]
    call = run.first_unfinished()
    if run.open_batch is None:
        return ["text", "tools", "text_end", "end", *note]
    if call is None:
        return ["finalize", "end"]
    if call.phase is CallPhase.REQUESTED:
        moves = ["supply"]
        if call.permission is Permission.ALLOW:
            moves.insert(0, "execute")
        if call.permission is Permission.ASK:
            moves.insert(0, "ask")
        if call.permission is Permission.DENY:
            moves.insert(0, "block")
        else:
            moves.append("input")
        return [*moves, "end"]
    if call.phase is CallPhase.EXECUTING:
        moves = ["complete", "fail", "seal", "delegate", "timer"]
        if call.policy is not RecoveryPolicy.INDETERMINATE and call.attempt < call.max_attempts:
            moves.insert(0, "retry")
        return [*moves, "end"]
    assert call.phase is CallPhase.AWAITING and call.approved
    moves = ["execute"] if call.attempt < call.max_attempts else []
    return [*moves, "block", "seal", "end"]  # block: the code now cannot run it (issue 34)


# Moves that end or restart a run are listed once, moves deeper into a batch several times, so
# that random logs reach retries, waits and resumes instead of mostly starting and ending runs.
RARE = {"end", "text_end", "activate", "reconcile", "seal", "text", "supply", "input"}


def _weighted(options: list[str]) -> list[str]:
    return [m for m in options for _ in range(1 if m in RARE else 3)]


@st.composite
def legal_logs(draw, *, prefix: str = "h", max_moves: int = 30) -> Scenario:  # noqa: C901
    """A random legal log of one thread, with the model's expectation of what it folds to."""
    ids = Ids(prefix)
    thread_id = ids("th")
    log = Log(thread_id)
    runs: dict[str, ShadowRun] = {}
    active: str | None = None
    moves: list[str] = []
    published: list[tuple[str, ...]] = []
    reconciliations = 0
    for _ in range(draw(st.integers(min_value=1, max_value=max_moves))):
        move = draw(st.sampled_from(_weighted(_options(runs, active))))
        moves.append(move)
        head = log.head
        shadow = runs.get(active or "")
        view = log.runs.get(active or "")
        call = shadow.first_unfinished() if shadow else None
        if move == "activate":
            run_id = ids("r")
            system = draw(st.sampled_from([None, "be brief"]))
            log.apply(drafts.activate(head, run_id, system=system, metadata={"n": len(runs)}))
            runs[run_id] = ShadowRun(run_id=run_id)
            active = run_id
            continue
        if move == "reconcile":
            candidates = [
                (run_id, c.call_id)
                for run_id, run in runs.items()
                for batch in run.batches
                for c in batch
                if c.phase is CallPhase.INDETERMINATE
            ]
            run_id, call_id = draw(st.sampled_from(candidates))
            outcome = draw(st.sampled_from(["applied", "not_applied", "unknown"]))
            log.apply(drafts.reconcile(head, log.run(run_id), call_id, outcome=outcome))
            reconciliations += 1
            continue
        assert shadow is not None and view is not None
        if move in ("text", "text_end"):
            log.apply(
                drafts.infer_text(
                    head, view, text=f"step {shadow.step + 1}", end=move == "text_end"
                )
            )
            shadow.step += 1
            if move == "text_end":
                shadow.state, shadow.end_cause, active = RunState.ENDED, EndCause.NATURAL, None
        elif move == "tools":
            n = draw(st.integers(min_value=1, max_value=3))
            calls: list[ToolCall] = []
            for index in range(n):
                calls.append(
                    drafts.make_call(
                        index,
                        ids=ids,
                        name=draw(st.sampled_from(["echo", "pay", "ask_user"])),
                        permission=draw(st.sampled_from(list(Permission))),
                        policy=draw(st.sampled_from(list(RecoveryPolicy))),
                        max_attempts=draw(st.integers(min_value=1, max_value=3)),
                    )
                )
            log.apply(drafts.infer_tools(head, view, tuple(calls)))
            shadow.step += 1
            shadow.batches.append(
                [
                    ShadowCall(
                        call_id=c.call_id,
                        tool_call_id=c.tool_call_id,
                        permission=c.permission,
                        policy=c.policy,
                        max_attempts=c.max_attempts,
                    )
                    for c in calls
                ]
            )
            shadow.finalized.append(False)
        elif move in ("execute", "retry"):
            assert call is not None
            log.apply(drafts.execute(head, view, call.call_id))
            call.phase, call.attempt, call.approved = CallPhase.EXECUTING, call.attempt + 1, False
            call.started = True
        elif move in ("supply", "complete", "fail", "block"):
            assert call is not None
            is_error = move in ("fail", "block")
            log.apply(drafts.complete(head, view, call.call_id, result=move, is_error=is_error))
            call.phase, call.is_error, call.approved = CallPhase.COMPLETED, is_error, False
        elif move == "seal":
            assert call is not None
            log.apply(drafts.seal(head, view, call.call_id, reason="cannot classify"))
            call.phase, call.is_error, call.approved = CallPhase.INDETERMINATE, True, False
        elif move in ("ask", "input", "delegate", "timer"):
            assert call is not None
            kind = {
                "ask": TicketKind.APPROVAL,
                "input": TicketKind.INPUT,
                "delegate": TicketKind.DELEGATION,
                "timer": TicketKind.TIMER,
            }[move]
            ticket_id = ids("tk")
            log.apply(drafts.wait(head, view, call.call_id, ticket_id, kind=kind))
            call.phase, call.ticket_id = CallPhase.AWAITING, ticket_id
            shadow.state, shadow.ticket, shadow.ticket_kind = RunState.AWAITING, ticket_id, kind
        elif move.startswith("resume:"):
            decision = Decision(move.removeprefix("resume:"))
            answer = {"answer": 42} if decision in (Decision.INPUT, Decision.RESPOND) else None
            log.apply(drafts.resume(head, view, decision, input=answer, reason="no"))
            waiting = next(c for c in shadow.open_batch or [] if c.ticket_id == shadow.ticket)
            if decision is Decision.APPROVE:
                waiting.approved = True
            else:
                waiting.phase = CallPhase.COMPLETED
                waiting.is_error = decision is Decision.DENY
            assert shadow.ticket is not None
            shadow.consumed.append(shadow.ticket)
            shadow.state, shadow.ticket, shadow.ticket_kind = RunState.RUNNING, None, None
        elif move == "finalize":
            log.apply(drafts.finalize(head, view))
            published.append(tuple(c.tool_call_id for c in shadow.batches[-1]))
            shadow.finalized[-1] = True
        elif move == "end":
            cause = draw(st.sampled_from([c for c in EndCause if c is not EndCause.NATURAL]))
            log.apply(drafts.end(head, view, cause))
            if shadow.open_batch is not None:
                for c in shadow.open_batch:
                    if not c.phase.terminal:
                        c.phase, c.is_error, c.approved = CallPhase.INDETERMINATE, True, False
                published.append(tuple(c.tool_call_id for c in shadow.batches[-1]))
                shadow.finalized[-1] = True
            if shadow.ticket is not None:
                shadow.consumed.append(shadow.ticket)
            shadow.state, shadow.end_cause, shadow.ticket, shadow.ticket_kind = (
                RunState.ENDED,
                cause,
                None,
                None,
            )
            active = None
        else:  # pragma: no cover - a move listed in _options without a branch here
            raise AssertionError(f"unknown move {move}")
    return Scenario(
        thread_id=thread_id,
        commits=list(log.commits),
        runs=runs,
        active=active,
        moves=moves,
        published=published,
        reconciliations=reconciliations,
    )
