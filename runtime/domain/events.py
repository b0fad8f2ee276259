"""The typed facts a ThreadCommit carries besides its disposition and messages.

Each event is one step of a state machine in ``transitions.py``; the log stores them as JSON
objects with a ``type`` key (see ``codec.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.domain.model import JSON, Decision, ResumeTicket, ToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class RunActivated:
    """A new Run starts on the thread (RunActivation: the first commit of a Run).

    A child Run names its parent run and the delegate call it answers, and its depth
    (1 for a child of a top-level run).
    """

    run_id: str
    agent: str
    metadata: JSON = None
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    depth: int = 0
    agent_version: str = ""  # the agent's deployed version the run started with (issue 34)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCommitted:
    """One inference was committed; the assistant message rides in the same commit."""

    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOpened:
    """The model's whole batch of tool calls, all Requested, before anything executes."""

    step: int
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallExecuting:
    """An executor attempt starts: an external effect may begin after this commit."""

    call_id: str
    attempt: int
    worker: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAwaiting:
    """The call waits on the ticket the same commit's Awaiting disposition carries."""

    call_id: str
    ticket_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildStarted:
    """A delegate call's child Run is committed (on its own thread, in the same database
    transaction); the call awaits ``ticket`` (kind delegation) until the child ends."""

    call_id: str
    child_run_id: str
    child_thread_id: str
    ticket: ResumeTicket


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResumed:
    """A validated ResumeCommand consumed the call's ticket.

    APPROVE leaves the call Awaiting but approved (the worker commits Executing next), with
    ``arguments`` replacing the model's when the operator edited them; DENY completes it
    with a denied error; INPUT completes it with the input as result; RESPOND completes it
    with ``input`` as the supplied result (the tool never runs).
    """

    call_id: str
    ticket_id: str
    decision: Decision
    input: JSON = None
    reason: str = ""
    arguments: JSON = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallCompleted:
    """The call's terminal result (output or error for the model)."""

    call_id: str
    result: str
    is_error: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CallIndeterminate:
    """The call's outcome cannot be classified, or its run ended before it finished."""

    call_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchFinalized:
    """Every call is terminal; the results are published in the model's call order."""

    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StateStaged:
    """A plugin's typed state (a JSON object under its key), staged by a StepStart,
    BeforeInference, AfterInference or AfterTool hook and committed with that boundary."""

    key: str
    value: JSON


@dataclass(frozen=True, slots=True, kw_only=True)
class RunForked:
    """The fork point: the commits before this one are copies of ``source_thread_id``'s
    commits 1..``source_seq`` (ids remapped, see runtime.fork), which end Step ``at_step`` of
    ``source_run_id``; nothing of them ran again. The same commit may carry the fork's new
    input as user messages, which the next inference sees after the copied history."""

    source_run_id: str
    source_thread_id: str
    at_step: int
    source_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPaused:
    """An operator paused the run: ``ticket`` (kind ``pause``, no call) stays open until a
    ``resume`` answers it. Nothing new starts meanwhile; a call whose effect started finishes
    and its result is committed; no worker holds the run. The commit's actor paused it."""

    ticket: ResumeTicket


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumed:
    """An operator answered the run's pause ticket: it continues from its committed frontier
    on any worker."""

    ticket_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMoved:
    """An operator moved the run to another deployed version of its agent (issue 34, item 3),
    after a dry run: from now on workers of ``to_version`` drive it. Its committed calls keep
    what was pinned when they were requested."""

    from_version: str
    to_version: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconciliationRecorded:
    """An operator recorded what the downstream system says of an Indeterminate call."""

    run_id: str
    call_id: str
    outcome: str  # "applied" | "not_applied" | "unknown"
    evidence: str = ""


Event = (
    RunActivated
    | StepCommitted
    | BatchOpened
    | CallExecuting
    | CallAwaiting
    | ChildStarted
    | CallResumed
    | CallCompleted
    | CallIndeterminate
    | BatchFinalized
    | StateStaged
    | RunForked
    | RunPaused
    | RunResumed
    | RunMoved
    | ReconciliationRecorded
)
