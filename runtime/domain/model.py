"""Typed state of Runs, tool calls, batches and tickets (the seed's vocabulary, no I/O).

Everything here is a frozen value. Transitions live in ``transitions.py``; the fold of a log
into state lives in ``fold.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from runtime.errors import InvalidDisposition

JSON = Any


class RunState(StrEnum):
    RUNNING = "running"
    AWAITING = "awaiting"
    ENDED = "ended"


class EndCause(StrEnum):
    NATURAL = "natural"
    STEP_LIMIT = "step_limit"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    FAILED = "failed"
    INDETERMINATE = "indeterminate"


class CallPhase(StrEnum):
    REQUESTED = "requested"
    EXECUTING = "executing"
    AWAITING = "awaiting"
    COMPLETED = "completed"
    INDETERMINATE = "indeterminate"

    @property
    def terminal(self) -> bool:
        return self in (CallPhase.COMPLETED, CallPhase.INDETERMINATE)


class TicketKind(StrEnum):
    APPROVAL = "approval"
    INPUT = "input"
    DELEGATION = "delegation"
    TIMER = "timer"
    # An operator's pause of the whole run (no call): only a ``resume`` answers it.
    PAUSE = "pause"


class RecoveryPolicy(StrEnum):
    """What recovery does with a call found Executing (the seed's ToolRecoveryPolicy)."""

    REPLAY = "replay"  # idempotent: run again with the same operation id
    RECONNECT = "reconnect"  # ask the downstream system by operation id first
    INDETERMINATE = "indeterminate"  # never guess: mark Indeterminate for a person


class Effects(StrEnum):
    """Whether a tool acts on anything outside the runtime (declared beside its policy, pinned
    into each call).

    ``none``: nothing outside changes (reads, waits, questions), so a sealed call leaves
    nothing to check; ``idempotent``: an effect that the same operation id applies at most
    once downstream; ``once``: an effect that may apply again if repeated. Only a call of a
    tool with an effect can need reconciliation (issue 22).
    """

    NONE = "none"
    IDEMPOTENT = "idempotent"
    ONCE = "once"

    @property
    def external(self) -> bool:
        """True when calling the tool may change something outside the runtime."""
        return self is not Effects.NONE


class Permission(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class Decision(StrEnum):
    """The typed answer a ResumeCommand carries."""

    APPROVE = "approve"
    DENY = "deny"
    INPUT = "input"
    # The approver answers for the tool: the call completes with the supplied result and
    # never runs (seed: "Awaiting -> Completed: denied or externally completed").
    RESPOND = "respond"
    # Answers a pause ticket: the run continues from its committed frontier.
    RESUME = "resume"


# Which decisions the log accepts for which ticket kind. A child's end answers its delegation
# ticket (INPUT carries a natural end's answer, DENY any other end); a timer fires (APPROVE).
# A timer's DENY stays readable for logs written while people could send it.
DECISIONS_FOR_KIND: dict[TicketKind, frozenset[Decision]] = {
    TicketKind.APPROVAL: frozenset({Decision.APPROVE, Decision.DENY, Decision.RESPOND}),
    TicketKind.INPUT: frozenset({Decision.INPUT, Decision.DENY}),
    TicketKind.DELEGATION: frozenset({Decision.INPUT, Decision.DENY}),
    TicketKind.TIMER: frozenset({Decision.APPROVE, Decision.DENY}),
    TicketKind.PAUSE: frozenset({Decision.RESUME}),
}

# Which decisions a person may send (console, API, CLI). A delegation ticket is answered only
# by its child run's end (seed: "accept only a command matching the committed ticket and wait
# kind"): to stop the wait, cancel the child. A timer's wait kind is a time: a person may fire
# it now (APPROVE, "Fire now"), never complete it otherwise; to stop it, cancel the run.
OPERATOR_DECISIONS: dict[TicketKind, frozenset[Decision]] = {
    TicketKind.APPROVAL: DECISIONS_FOR_KIND[TicketKind.APPROVAL],
    TicketKind.INPUT: DECISIONS_FOR_KIND[TicketKind.INPUT],
    TicketKind.DELEGATION: frozenset(),
    TicketKind.TIMER: frozenset({Decision.APPROVE}),
    TicketKind.PAUSE: frozenset({Decision.RESUME}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeTicket:
    """One typed correlation and target that may resume an Awaiting Run.

    ``request`` is what the person or system is asked (JSON object); ``schema`` is the JSON
    schema an input answer must satisfy (input tickets only). A ``pause`` ticket belongs to
    the run, not to a call (``call_id`` is empty); its request is ``{"reason", "paused_by",
    "paused_at"}`` (see ``RunView.pause``).
    """

    id: str
    run_id: str
    call_id: str
    kind: TicketKind
    request: JSON = field(default_factory=dict)
    schema: JSON | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeCommand:
    """A request to resume an Awaiting Run at its committed ticket (validated, never trusted)."""

    ticket_id: str
    kind: TicketKind
    decision: Decision
    input: JSON | None = None
    reason: str = ""
    call_id: str | None = None
    # APPROVE only: the operator's edit of the call's arguments (a JSON object), run instead
    # of the model's; the model's stay in BatchOpened and the call's projection.
    arguments: JSON | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Disposition:
    """The RunDisposition a ThreadCommit carries: Running | Awaiting(ticket) | Ended(cause).

    Build it with ``running()``, ``awaiting(ticket)`` or ``ended(cause)``; ``validate()`` raises
    InvalidDisposition for any other shape (DESIGN.md, "The commit log").
    """

    state: RunState
    ticket: ResumeTicket | None = None
    end_cause: EndCause | None = None
    error: JSON | None = None

    @classmethod
    def running(cls) -> Disposition:
        return cls(state=RunState.RUNNING)

    @classmethod
    def awaiting(cls, ticket: ResumeTicket) -> Disposition:
        return cls(state=RunState.AWAITING, ticket=ticket)

    @classmethod
    def ended(cls, cause: EndCause, error: JSON | None = None) -> Disposition:
        return cls(state=RunState.ENDED, end_cause=cause, error=error)

    def validate(self) -> None:
        if self.state is RunState.AWAITING and self.ticket is None:
            raise InvalidDisposition("an Awaiting disposition must carry its ResumeTicket")
        if self.state is not RunState.AWAITING and self.ticket is not None:
            raise InvalidDisposition(f"a disposition of {self.state.value} cannot carry a ticket")
        if self.state is RunState.ENDED and self.end_cause is None:
            raise InvalidDisposition("an Ended disposition must carry its EndCause")
        if self.state is not RunState.ENDED and (self.end_cause or self.error):
            raise InvalidDisposition(
                f"a disposition of {self.state.value} cannot carry an EndCause"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One durable tool call of a batch, with its pinned policy and permission.

    ``arguments`` is the parsed JSON object when the model's text parsed, else None and
    ``arguments_text`` keeps the raw text: what the tool runs with, which is an operator's
    edit once one was approved; ``model_arguments`` then keeps the model's own (None while
    nobody edited them). ``attempt`` counts committed executor attempts.
    ``approved`` is set when a matching approval was committed and the call has not yet
    started executing. ``effect_may_have_started`` tells an Indeterminate call sealed from
    Executing (needs reconciliation) from one sealed before any attempt or of a tool without
    external effects. ``effects`` is the tool's declared Effects, pinned with the batch; a
    call logged before effects were declared reads as ``once`` (the old rule: any started
    call may have taken effect). ``source`` is where
    the tool came from, pinned with the batch: ``{"kind": "python"}`` or ``{"kind": "mcp",
    "server", "tool", "transport", "target", "server_info", "input_schema", "annotations",
    "lookup"}``; recovery uses it, never what the server lists later.
    """

    call_id: str
    index: int
    tool_call_id: str
    name: str
    arguments: JSON | None
    arguments_text: str
    operation_id: str
    policy: RecoveryPolicy
    permission: Permission
    max_attempts: int = 1
    phase: CallPhase = CallPhase.REQUESTED
    attempt: int = 0
    ticket_id: str | None = None
    approved: bool = False
    result: str | None = None
    is_error: bool = False
    effect_may_have_started: bool = False
    effects: Effects = Effects.ONCE
    source: JSON = field(default_factory=lambda: {"kind": "python"})
    child_run_id: str | None = None
    woken_at: str | None = None
    model_arguments: JSON | None = None

    @property
    def detached(self) -> bool:
        """Awaiting its delegated child: a wait that does not hold later calls back.

        Terminal-only delegation runs concurrently (seed: "Terminal-only child delegation may
        run concurrently"); every other wait blocks the calls after it.
        """
        return self.phase is CallPhase.AWAITING and self.child_run_id is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolBatch:
    """The ActiveToolBatch of one Step: every call of one model response, in model order."""

    step: int
    calls: tuple[ToolCall, ...]
    finalized: bool = False

    def call(self, call_id: str) -> ToolCall | None:
        return next((c for c in self.calls if c.call_id == call_id), None)

    @property
    def all_terminal(self) -> bool:
        return all(c.phase.terminal for c in self.calls)


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A committed message. ``tool_calls`` items are {"id", "name", "arguments"} with the
    arguments as the raw text the model produced (untrusted)."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str = ""
    tool_calls: tuple[JSON, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    meta: JSON = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView:
    """The committed state of one Run, as folded from its thread's log."""

    run_id: str
    thread_id: str
    agent: str
    state: RunState = RunState.RUNNING
    end_cause: EndCause | None = None
    error: JSON | None = None
    step: int = 0  # inferences committed
    batches: tuple[ToolBatch, ...] = ()
    ticket: ResumeTicket | None = None
    consumed_tickets: tuple[str, ...] = ()
    version: int = 0  # sequence of the last commit that touched this run
    # Open delegation tickets, one per call awaiting its child (see ToolCall.detached).
    waits: tuple[ResumeTicket, ...] = ()
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    depth: int = 0
    plugin_state: dict[str, JSON] = field(default_factory=dict)  # by plugin key
    # An operator's pause: a ticket of kind ``pause`` held beside the disposition (README,
    # "Pause"). While it is open nothing new starts and no worker claims the run; only a
    # ``resume`` consumes it. The disposition stays what the loop left (Running, or Awaiting
    # its own ticket, which stays answerable).
    pause: ResumeTicket | None = None
    agent_version: str = ""  # its agent's deployed version it started with (RunActivated)

    @property
    def paused(self) -> bool:
        return self.pause is not None

    def wait(self, ticket_id: str) -> ResumeTicket | None:
        return next((w for w in self.waits if w.id == ticket_id), None)

    @property
    def open_batch(self) -> ToolBatch | None:
        if self.batches and not self.batches[-1].finalized:
            return self.batches[-1]
        return None

    def find_call(self, call_id: str) -> ToolCall | None:
        for batch in self.batches:
            if (found := batch.call(call_id)) is not None:
                return found
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    """An operator's record of what the downstream system says of an Indeterminate call."""

    call_id: str
    run_id: str
    outcome: str  # "applied" | "not_applied" | "unknown"
    evidence: str = ""
    actor: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadHead:
    """A thread's head: the sequence of its last commit and its one non-Ended run, if any."""

    thread_id: str
    version: int = 0
    active_run_id: str | None = None
