"""The API's request and response schemas (pydantic, via django-ninja).

Inputs are strict about what the stores cannot hold: text never carries NUL characters or lone
surrogates (PostgreSQL refuses both) and free-form JSON holds only finite numbers, so a bad
request is a 422, never a 500. Outputs mirror ``runtime.documents``; timestamps pass through as
the ISO 8601 strings the run document carries, so the API and ``runtime_show --json`` agree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import (
    AfterValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    model_validator,
)
from pydantic_core import PydanticCustomError

from runtime.domain.commit import PAUSE_REASON_MAX
from runtime.untrusted import UntrustedJSONError, check_storable, text_problem

# -- constrained values ---------------------------------------------------------------------------

ID_PATTERN = r"^[0-9A-Za-z_-]+$"
MAX_SEQ = 2**63 - 1  # a commit sequence fits a signed 64-bit column on every database


def _storable_text(value: str) -> str:
    """Refuse text no database column can hold: NUL characters and lone surrogates."""
    if (problem := text_problem(value)) is not None:
        raise PydanticCustomError("unstorable_text", problem)
    return value


def _storable_json(value: Any) -> Any:
    """Refuse JSON the databases cannot store (the runtime's one rule: ``check_storable``)."""
    try:
        check_storable(value, "the value")
    except UntrustedJSONError as exc:
        raise ValueError(str(exc)) from None
    return value


Id = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
AgentName = Annotated[str, Field(min_length=1, max_length=100), AfterValidator(_storable_text)]
StorableText = Annotated[str, AfterValidator(_storable_text)]  # no NUL, no lone surrogate
JsonValue = Annotated[Any, AfterValidator(_storable_json)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable_json)]
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


# Text every database can store, by length limit.
InputText = Annotated[str, Field(min_length=1, max_length=200_000), AfterValidator(_storable_text)]
Note = Annotated[str, Field(max_length=2000), AfterValidator(_storable_text)]
Evidence = Annotated[str, Field(max_length=20_000), AfterValidator(_storable_text)]
PauseReason = Annotated[
    str, Field(max_length=PAUSE_REASON_MAX), AfterValidator(_storable_text)
]  # the same limit on every surface (operations refuses longer ones too)


RunStateName = Literal["running", "awaiting", "ended"]
EndCauseName = Literal["natural", "step_limit", "cancelled", "stopped", "failed", "indeterminate"]
TicketKindName = Literal["approval", "input", "delegation", "timer"]
# What a resume command may name: a call's ticket, or the run's pause ticket (README, "Pause").
ResumeKindName = Literal["approval", "input", "delegation", "timer", "pause"]
TicketStateName = Literal["open", "consumed", "void"]
CallPhaseName = Literal["requested", "executing", "awaiting", "completed", "indeterminate"]
PolicyName = Literal["replay", "reconnect", "indeterminate"]
EffectsName = Literal["none", "idempotent", "once"]
PermissionName = Literal["allow", "ask", "deny"]
Outcome = Literal["applied", "not_applied", "unknown"]


# -- errors ---------------------------------------------------------------------------------------


class ErrorBody(Schema):
    code: str = Field(description="stable machine-readable error code, e.g. ticket_mismatch")
    message: str
    detail: dict[str, Any] = Field(
        default_factory=dict,
        description="more about the error; a 409 from resume carries the committed run "
        "document under detail.run",
    )


class ErrorOut(Schema):
    error: ErrorBody


class CommittedOut(Schema):
    """A command that took effect, whose run could not be read after its commit (202)."""

    committed: Literal[True] = True
    run_id: str
    seq: int | None = Field(
        description="the command's commit (its sequence in the thread's log); null for a start "
        "or a fork: the run it made is what took effect"
    )
    message: str


# -- requests -------------------------------------------------------------------------------------


class InputMessage(Schema):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "system"] = "user"
    content: InputText


class ThreadIn(Schema):
    model_config = ConfigDict(extra="forbid")

    metadata: JsonObject = Field(default_factory=dict)


def _input_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    return "messages" if isinstance(value, list) else None


# Text or messages, told apart by type, so an error names the one form that was sent
# (``input.text``, ``input.messages.0.role``), not both.
RunInput = Annotated[
    Annotated[InputText, Tag("text")]
    | Annotated[list[InputMessage], Field(min_length=1, max_length=100), Tag("messages")],
    Discriminator(
        _input_kind,
        custom_error_type="input_type",
        custom_error_message="input is text or a list of messages",
    ),
]


class RunIn(Schema):
    """Start a run: the agent's name, its input (text or messages) and free-form metadata."""

    model_config = ConfigDict(extra="forbid")

    agent: AgentName
    input: RunInput
    metadata: JsonObject = Field(
        default_factory=dict,
        description='free-form; {"script": {...}} drives the scripted model (demo agent)',
    )


class ForkIn(Schema):
    """Fork a run after one of its steps: the step, and an optional new input the fork's next
    inference sees after the copied history."""

    model_config = ConfigDict(extra="forbid")

    at_step: int = Field(ge=1, le=100_000, description="copy the history to this step's end")
    input: RunInput | None = None


class ResumeIn(Schema):
    """Answer the open ticket: ``decision`` (approve / deny / respond), or ``input``, or
    ``result``.

    ``input`` (or ``result`` without a decision) answers an input ticket (it must match the
    ticket's schema); ``result`` with ``decision: respond`` completes an approval ticket with
    that supplied result and the tool never runs. A timer ticket takes ``decision: approve``
    only (fire it now); a delegation ticket takes nothing from a person (its child run's end
    answers it; cancel the child to stop it): both refuse the rest with 409
    ``ticket_not_answerable``. ``arguments`` (approve only) replaces the model's arguments with
    an operator's edit; the model's stay on record. ``note`` is recorded as the reason.

    ``kind: pause`` (``decision: resume`` or none, ``ticket_id`` optional: the run's open
    pause ticket) resumes a paused run; it needs the operate permission, like the pause.
    """

    model_config = ConfigDict(extra="forbid")

    ticket_id: Id | None = Field(None, description="the open ticket; optional for kind pause")
    kind: ResumeKindName
    decision: Literal["approve", "deny", "input", "respond", "resume"] | None = None
    input: JsonValue = None
    result: JsonValue = None
    arguments: dict[str, JsonValue] | None = Field(
        None, description="approve only: the operator's edited arguments (a JSON object)"
    )
    note: Note = ""
    call_id: Id | None = Field(None, description="optional: the call the ticket belongs to")

    @model_validator(mode="after")
    def _one_answer(self) -> ResumeIn:
        given = {"input", "result"} & self.model_fields_set
        if self.kind == "pause":
            if self.decision not in (None, "resume") or given or self.arguments is not None:
                raise ValueError("kind 'pause' takes decision 'resume' and a note only")
            return self
        if self.ticket_id is None:
            raise ValueError("ticket_id names the open ticket")
        if self.decision == "resume":
            raise ValueError("decision 'resume' answers only kind 'pause'")
        if "arguments" in self.model_fields_set and self.decision != "approve":
            raise ValueError("arguments ride only with decision 'approve'")
        if self.decision == "respond":
            if given != {"result"}:
                raise ValueError("decision 'respond' takes the supplied result in 'result'")
        elif self.decision in ("approve", "deny"):
            if given:
                raise ValueError(f"decision {self.decision!r} takes no {' or '.join(given)}")
        elif len(given) != 1:
            raise ValueError("give exactly one of decision (approve / deny), input or result")
        return self


class CancelIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: Note = ""


class PauseIn(Schema):
    """Pause a run; ``reason`` is recorded with the committed pause."""

    model_config = ConfigDict(extra="forbid")

    reason: PauseReason = ""


class MoveIn(Schema):
    """Move runs of ``agent`` to the version of it the server carries (issue 34, item 3):
    those on ``from_version`` when given, those of ``run_ids`` when given, at most ``limit``
    (by version, then oldest first). ``apply`` false (the default) is a dry run that writes
    nothing."""

    model_config = ConfigDict(extra="forbid")

    agent: AgentName
    from_version: Annotated[str, Field(max_length=100), AfterValidator(_storable_text)] | None = (
        None
    )
    run_ids: Annotated[list[Id], Field(min_length=1, max_length=1000)] | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=1000)] = 100
    reason: PauseReason = ""
    apply: StrictBool = False  # a string such as "yes" is refused, never read as true


class MovePlanOut(Schema):
    """What moving one run changes: ``changes`` (a line per call it touches), ``next`` (what
    it does next on the new version), ``refused`` (why it is not moved now, "" when it is
    or can be)."""

    run_id: str
    agent: str
    from_version: str
    to_version: str
    state: str
    paused: bool
    changes: list[str]
    next: str
    refused: str


class MoveOut(Schema):
    agent: str
    to_version: str
    runs: list[MovePlanOut]
    moved: list[str]  # the runs this request moved (none for a dry run)
    more: bool  # more runs match than ``limit``: send it again


class ReconcileIn(Schema):
    model_config = ConfigDict(extra="forbid")

    outcome: Outcome
    evidence: Evidence = ""
    correction: bool = Field(
        False,
        description="true when this outcome corrects (contradicts) the call's earlier record; "
        "without it a contradicting outcome is refused with 409 reconciliation_contradicts",
    )


# -- the run document -----------------------------------------------------------------------------


class MessageOut(Schema):
    role: str
    content: str
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    name: str | None = None
    seq: int


class LateResultOut(Schema):
    attempt: int
    result: str
    is_error: bool
    worker: str
    at: Timestamp


class CallOut(Schema):
    index: int
    call_id: str
    tool_call_id: str
    name: str
    arguments: Any = Field(
        None,
        description="what the call runs with (an operator's approved edit, or the model's), "
        "parsed; null when unparsable",
    )
    arguments_text: str
    model_arguments: Any = Field(
        None,
        description="the model's own arguments when an operator approved an edit of them "
        "(then `arguments` holds the edit); null otherwise",
    )
    phase: CallPhaseName
    attempt: int
    max_attempts: int
    operation_id: str = Field(description="pass downstream to check or deduplicate the effect")
    policy: PolicyName
    permission: PermissionName
    effects: EffectsName = Field(
        "once",
        description="whether the tool changes anything outside, pinned with the batch: "
        '"none" (a sealed call needs no reconciliation), "idempotent" or "once"',
    )
    source: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "python"},
        description='where the tool came from, pinned with the batch: {"kind": "python"} or '
        '{"kind": "mcp", "server", "tool", "transport", "target", "server_info", '
        '"input_schema", "annotations", "lookup"}',
    )
    approved: bool
    result: str | None = None
    is_error: bool
    effect_may_have_started: bool
    updated_at: Timestamp | None = None
    late_results: list[LateResultOut] = Field(
        default_factory=list,
        description="results of superseded or sealed attempts, reported late; never published",
    )
    possible_duplicate: bool = Field(
        False,
        description="a non-replay call got a late result from another attempt: its effect may "
        "have happened twice; check downstream by operation id",
    )


class BatchOut(Schema):
    step: int
    finalized: bool
    calls: list[CallOut]


class TicketOut(Schema):
    model_config = ConfigDict(populate_by_name=True)

    id: str
    kind: TicketKindName
    call_id: str
    request: Any = None
    answer_schema: dict[str, Any] | None = Field(
        None, alias="schema", description="the JSON schema an input answer must match"
    )
    state: TicketStateName
    created_at: Timestamp
    closed_at: Timestamp | None = None
    closed_by: str = ""
    decision: str = ""
    due_at: Timestamp | None = Field(None, description="a timer's fire time (UTC)")


class ParentOut(Schema):
    run: str = Field(description="the parent run's id")
    call: str = Field(description="the parent's delegate call this run answers")


class ChildOut(Schema):
    id: str
    agent: str
    state: RunStateName
    end_cause: EndCauseName | None = None
    call_id: str | None = Field(None, description="the parent's delegate call")


class PauseOut(Schema):
    """A run's open pause: its ticket (kind pause) and who paused it, when and why."""

    ticket_id: str
    paused_by: str = ""
    paused_at: Timestamp | None = None
    reason: str = ""
    line: str = Field(description='"paused by X at T: reason"')


class RunOut(Schema):
    """The run document (shared with ``runtime_show --json``) plus ``active_batch``."""

    id: str
    thread_id: str
    agent: str
    agent_version: str = Field(
        "",
        description="the deployed version of its agent it started with (Agent.version, "
        "else a digest of the definition)",
    )
    state: RunStateName
    end_cause: EndCauseName | None = None
    error: Any = None
    version: int = Field(description="sequence of the run's last commit")
    step: int
    ticket: TicketOut | None = Field(None, description="the ticket the run waits on, if any")
    tickets: list[TicketOut] = Field(
        default_factory=list, description="every open ticket (children's delegation tickets too)"
    )
    pause: PauseOut | None = Field(
        None, description="the operator's pause, while the run is paused (resume answers it)"
    )
    parent: ParentOut | None = Field(None, description="the run and call this child answers")
    depth: int = Field(0, description="0 for a top-level run, 1 for its children, ...")
    children: list[ChildOut] = Field(default_factory=list, description="child runs, oldest first")
    plugin_state: dict[str, Any] = Field(
        default_factory=dict, description="committed plugin state by plugin key"
    )
    batches: list[BatchOut]
    active_batch: BatchOut | None = Field(None, description="the open (unfinalized) batch")
    mcp_servers: list[dict[str, Any]] = Field(
        default_factory=list,
        description='MCP servers the calls used: [{"server", "transport", "target", '
        '"server_info", "tools"}]',
    )
    messages: list[MessageOut]
    metadata: dict[str, Any] = Field(default_factory=dict)
    waiting: str | None = Field(
        None,
        description="why a Running run that no worker holds waits: a limit's slots are all "
        'held ("waiting for a slot: agent X, 5 of 5 running") or its model\'s budget is '
        "paused; null when nothing holds it back",
    )
    created_by: str = ""
    created_at: Timestamp
    committed_at: Timestamp | None = Field(None, description="time of the run's last commit")
    trace_id: str | None = Field(
        None, description="the run's OpenTelemetry trace id, once a traced worker drove it"
    )


class RunSummaryOut(Schema):
    id: str
    thread_id: str
    agent: str
    agent_version: str = Field("", description="the version of its agent it is on")
    state: RunStateName
    end_cause: EndCauseName | None = None
    version: int
    step: int
    created_by: str = ""
    created_at: Timestamp
    committed_at: Timestamp | None = None
    paused: bool = Field(False, description="an operator paused it (see the run's pause)")
    input: str = Field(
        "", description="the first line of its input (its first user message), up to 400 characters"
    )
    waiting: str | None = Field(
        None,
        description="why a Running run no worker holds waits (a model's budget, a model "
        "outage, until its next try; no live worker that may drive its agent's version); the "
        "run document also names a limit's held slots",
    )


class RunPageOut(Schema):
    items: list[RunSummaryOut]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page")


# -- threads --------------------------------------------------------------------------------------


class ThreadMessageOut(MessageOut):
    run_id: str


class ThreadOut(Schema):
    id: str
    created_at: Timestamp
    version: int = Field(description="sequence of the thread's last commit")
    active_run_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    messages: list[ThreadMessageOut] = Field(default_factory=list)
    runs: list[RunSummaryOut] = Field(default_factory=list)


# -- the log --------------------------------------------------------------------------------------


class CommitOut(Schema):
    seq: int = Field(description="the commit's sequence on its thread (the SSE event id)")
    thread_id: str
    run_id: str | None = None
    disposition: dict[str, Any] | None = Field(
        None, description="Running | Awaiting(ticket) | Ended(cause), as committed"
    )
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    actor: str = ""
    agent_version: str = Field(
        "", description="the deployed version of the agent whose code wrote it (a worker's)"
    )
    created_at: Timestamp


class CommitPageOut(Schema):
    items: list[CommitOut]
    next_after: int | None = Field(None, description="pass as ?after= for the next page")


# -- tickets and tool calls -----------------------------------------------------------------------


class TicketItemOut(TicketOut):
    run_id: str
    thread_id: str
    agent: str
    call: CallOut


class TicketPageOut(Schema):
    items: list[TicketItemOut]
    next_cursor: str | None = None


class ReconciliationOut(Schema):
    id: int
    call_id: str
    run_id: str
    thread_id: str
    seq: int = Field(description="the thread commit that recorded the fact")
    outcome: Outcome
    evidence: str = ""
    actor: str = ""
    created_at: Timestamp


class ToolCallItemOut(CallOut):
    run_id: str
    thread_id: str
    agent: str
    step: int
    ticket_id: str | None = None
    reconciliations: list[ReconciliationOut] = Field(default_factory=list)


class ToolCallPageOut(Schema):
    items: list[ToolCallItemOut]
    next_cursor: str | None = None
