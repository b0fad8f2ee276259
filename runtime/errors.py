"""Typed errors of the runtime. One root, one subclass per refusal; a docstring is its message.

The API and the console map these to status codes and error codes in one place
(console/api/errors.py); ``code`` is the stable machine-readable name.
"""

from __future__ import annotations

from typing import Any


class RuntimeFault(Exception):
    """The runtime refused an operation."""

    code = "runtime_error"
    status = 400
    retry_after: int | None = None  # seconds a client should wait before it tries again

    def __init__(self, message: str | None = None, **detail: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.detail = detail
        super().__init__(self.message)


class CommittedUnread(Exception):
    """The command was committed, but the run could not be read after it: read the run, or
    send the same command again for its answer (nothing is written twice).

    Not a RuntimeFault: nothing was refused. ``run_id`` and ``seq`` (the commit; None for a
    start or a fork, whose run is what took effect) say what took effect; ``__cause__`` is
    what failed after it.
    """

    def __init__(self, *, run_id: str, seq: int | None) -> None:
        self.run_id, self.seq = run_id, seq
        what = f"commit #{seq} of run {run_id}" if seq is not None else f"run {run_id}"
        self.message = (
            f"The command was committed ({what}), but the run could not be read after it. "
            "Read the run, or send the same command again for its answer."
        )
        super().__init__(self.message)


class IllegalTransition(RuntimeFault):
    """The change is not a legal transition of the state machine."""

    code = "illegal_transition"
    status = 409

    def __init__(self, machine: str, from_: str, to: str, why: str, **detail: Any) -> None:
        super().__init__(
            f"{machine}: {from_} -> {to} is not allowed: {why}",
            machine=machine,
            from_state=from_,
            to_state=to,
            why=why,
            **detail,
        )


class InvalidCommit(RuntimeFault):
    """The commit is malformed and was not written."""

    code = "invalid_commit"
    status = 422


class InvalidDisposition(InvalidCommit):
    """Only an Awaiting disposition carries a ticket, and it must carry one."""

    code = "invalid_disposition"


class VersionConflict(RuntimeFault):
    """Another writer committed first; reload the committed state and decide again."""

    code = "version_conflict"
    status = 409


class LeaseLost(RuntimeFault):
    """This worker no longer holds the run's lease; another worker owns it."""

    code = "lease_lost"
    status = 409


class NotFound(RuntimeFault):
    """No such object."""

    code = "not_found"
    status = 404


class UnknownAgent(NotFound):
    """No agent is registered under that name."""

    code = "unknown_agent"


class RunAlreadyActive(RuntimeFault):
    """The thread already has a run that has not ended."""

    code = "run_active"
    status = 409


class NotActiveRun(RuntimeFault):
    """The run is not the thread's active run."""

    code = "not_active_run"
    status = 409


class RunEnded(RuntimeFault):
    """The run has ended; an ended run is never reopened."""

    code = "run_ended"
    status = 409


class NotAwaiting(RuntimeFault):
    """The run is not awaiting a resume command."""

    code = "not_awaiting"
    status = 409


class AlreadyPaused(RuntimeFault):
    """The run is already paused; resume it first."""

    code = "already_paused"
    status = 409


class NotPaused(RuntimeFault):
    """The run is not paused; only a paused run is resumed."""

    code = "not_paused"
    status = 409


class RunIsPaused(RuntimeFault):
    """The run is paused: nothing new starts until an operator resumes it."""

    code = "run_paused"
    status = 409


class TicketMismatch(RuntimeFault):
    """The command names a ticket, call or run other than the open ticket."""

    code = "ticket_mismatch"
    status = 409


class KindMismatch(RuntimeFault):
    """The command's kind or decision does not answer the open ticket's kind."""

    code = "kind_mismatch"
    status = 409

    def __init__(self, *, ticket_kind: str, given_kind: str, decision: str, allowed: list[str]):
        if given_kind != ticket_kind:
            why = f"The command names kind {given_kind}; the open ticket is of kind {ticket_kind}"
        else:
            why = f"The decision {decision} does not answer the open {ticket_kind} ticket"
        super().__init__(
            f"{why} (its decisions: {', '.join(allowed)}).",
            ticket_kind=ticket_kind,
            given_kind=given_kind,
            decision=decision,
            allowed=allowed,
        )


class TicketNotAnswerable(RuntimeFault):
    """People do not answer this ticket that way: the runtime answers it (a delegation
    ticket by its child run's end, a timer by firing); cancel the run instead."""

    code = "ticket_not_answerable"
    status = 409


class TicketConsumed(RuntimeFault):
    """The ticket has already been answered; a consumed ticket is never delivered again."""

    code = "ticket_consumed"
    status = 409


class InvalidInput(RuntimeFault):
    """The input does not match the ticket's JSON schema."""

    code = "invalid_input"
    status = 422


class IdempotencyKeyReused(RuntimeFault):
    """The idempotency key was already used with a different request."""

    code = "idempotency_key_reused"
    status = 422


class ScriptRefused(RuntimeFault):
    """Scripted runs are disabled, or the script is malformed."""

    code = "script_refused"
    status = 422


class DatabaseUnavailable(RuntimeFault):
    """The database could not be reached, or did not answer in time; try again shortly."""

    code = "database_unavailable"
    status = 503
    retry_after = 2

    @classmethod
    def timed_out(cls, which: str | None) -> DatabaseUnavailable:
        """The fault of a statement a web request's timeout cancelled (console.timeouts):
        ``which`` is "statement" or "lock" (``detail.timeout``); None: the plain fault."""
        if which is None:
            return cls()
        return cls(
            f"The database did not answer within the request's {which} timeout "
            "(another transaction may hold what it needs); try again shortly.",
            timeout=which,
        )


class ToolSourceUnavailable(RuntimeFault):
    """A tool source of the agent (``runtime.sources``) cannot serve this claim."""

    code = "tool_source_unavailable"
    status = 503


class McpServerUnavailable(ToolSourceUnavailable):
    """An MCP server of the agent could not be started or reached."""

    code = "mcp_server_unavailable"
    status = 503


class ImportRefused(RuntimeFault):
    """The thread log cannot be imported; nothing was written."""

    code = "import_refused"
    status = 422


class ForkRefused(RuntimeFault):
    """The run cannot be forked at that step (no such step, or it has not finished); nothing
    was written."""

    code = "fork_refused"
    status = 409


class MoveRefused(RuntimeFault):
    """The run cannot be moved to that version of its agent (it ended, a worker drives it
    now, it is on that version already, or another command moved it first); nothing was
    written. ``detail`` says why."""

    code = "move_refused"
    status = 409


class DelegationRefused(RuntimeFault):
    """The delegation exceeds a limit (depth or children per batch); no child was started."""

    code = "delegation_refused"
    status = 422


class ReconciliationContradicts(RuntimeFault):
    """The outcome contradicts the call's earlier reconciliation; record it as a correction."""

    code = "reconciliation_contradicts"
    status = 409


class InvalidLimit(RuntimeFault):
    """The limit is malformed (RUNTIME_RUN_LIMITS, RUNTIME_MODEL_LIMITS or an agent's
    declaration)."""

    code = "invalid_limit"
    status = 400


class WebhookRefused(RuntimeFault):
    """The webhook endpoint is refused (its URL, events or secret); nothing was written."""

    code = "webhook_refused"
    status = 422
