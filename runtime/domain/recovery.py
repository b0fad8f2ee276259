"""The seed's recovery decision table as pure functions.

``next_action`` reads a committed RunView and says what a worker does next; the loop applies
it. ``executing_decision`` applies a call's pinned ToolRecoveryPolicy to a call found
Executing. Neither guesses: what cannot be classified becomes Indeterminate.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.domain.model import (
    CallPhase,
    Effects,
    RecoveryPolicy,
    ResumeTicket,
    RunState,
    RunView,
    ToolBatch,
    ToolCall,
)


@dataclass(frozen=True, slots=True)
class Infer:
    """Running, no open batch: ask the model for the next Step."""

    step: int


@dataclass(frozen=True, slots=True)
class StepLimit:
    """Running, no open batch, but the step limit is reached: end the run."""


@dataclass(frozen=True, slots=True)
class Gate:
    """A call at Requested: run the gates, commit Executing or Awaiting, then execute."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class ExecuteApproved:
    """A call Awaiting with a committed approval: commit Executing, then execute."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class RecoverExecuting:
    """A call found Executing: apply its pinned ToolRecoveryPolicy."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class Finalize:
    """Every call is terminal: publish the results in call order."""

    batch: ToolBatch


@dataclass(frozen=True, slots=True)
class Park:
    """Only calls awaiting their children are left: the run waits on the first one's ticket
    (so that no worker holds it) until a child's terminus is delivered."""

    ticket: ResumeTicket


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do for a worker: the run awaits its ticket or has ended."""

    state: RunState


Action = Infer | StepLimit | Gate | ExecuteApproved | RecoverExecuting | Finalize | Park | Idle


def next_action(run: RunView, step_limit: int) -> Action:
    """Return what the committed frontier calls for (the seed's recovery decision table).

    An open batch is resolved before the model is asked anything; calls are taken in the
    model's order; terminal calls are kept as they are; calls awaiting a delegated child do
    not hold later calls back, and the batch finalizes only when every call is terminal.
    """
    if run.state is not RunState.RUNNING:
        return Idle(run.state)
    batch = run.open_batch
    if batch is None:
        return StepLimit() if run.step >= step_limit else Infer(run.step + 1)
    for call in batch.calls:
        if call.detached:
            continue
        if call.phase is CallPhase.REQUESTED:
            return Gate(call)
        if call.phase is CallPhase.EXECUTING:
            return RecoverExecuting(call)
        if call.phase is CallPhase.AWAITING:
            return ExecuteApproved(call) if call.approved else Idle(RunState.AWAITING)
    if run.waits:
        return Park(run.waits[0])
    return Finalize(batch)


@dataclass(frozen=True, slots=True)
class Retry:
    """Run the tool again as attempt ``attempt``, with the same operation id."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Lookup:
    """Ask the downstream system by operation id before anything else."""


@dataclass(frozen=True, slots=True)
class Seal:
    """Mark the call Indeterminate for a person to reconcile."""

    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    """Complete the call with ``reason`` as its error result, for the model to read: the tool
    raised, and its declared effects leave nothing for a person to check."""

    reason: str


RecoveryDecision = Retry | Lookup | Seal | Fail


def executing_decision(
    call: ToolCall,
    *,
    looked_up: bool = False,
    lookup_failed: str | None = None,
    raised: str | None = None,
    cannot_run: str | None = None,
) -> RecoveryDecision:
    """Apply the pinned policy to a call whose attempt may have started and has no result.

    ``looked_up`` is True once a reconnect lookup found nothing; ``lookup_failed`` says why a
    reconnect lookup could not answer (it raised: an error result, a lost or unreachable
    server); ``raised`` is the exception the tool's last attempt raised ("Type: message"),
    None when the attempt left no word (the worker stopped). Returns Retry while the pinned
    attempt budget allows, Lookup for reconnect tools first, else Seal. A lookup that cannot
    answer seals the call: its outcome is unknown (seed: "outcome cannot be classified
    safely"), and neither retrying the effect nor failing the claim (the poison budget) would
    learn more.

    A tool that raised and declared no effect or an idempotent one (``Effects``) gets Fail
    instead of Seal (issue 31, item 7): its bug is the model's error result, not a person's
    Reconcile work. Only a ``once`` effect that may have started goes to Reconcile.

    ``cannot_run`` says why the code that drives the run now cannot run the call again: a
    deploy removed or renamed its tool, or the tool's current schema refuses its arguments
    (issue 34). There is no Retry then: the call is sealed when its ``once`` effect may have
    started, else it fails with that reason, and the run goes on either way.
    """
    decision = _policy_decision(call, looked_up=looked_up, lookup_failed=lookup_failed)
    tries = f"{call.attempt} attempt{'' if call.attempt == 1 else 's'}"
    if cannot_run is not None and isinstance(decision, Retry | Lookup):
        if call.effects is Effects.ONCE:
            return Seal(f"{cannot_run}; the effect of its last attempt may have started")
        return Fail(f"{cannot_run}; not run again after {tries}")
    if isinstance(decision, Seal) and raised is not None and call.effects is not Effects.ONCE:
        return Fail(f"the tool raised {raised} ({tries})")
    return decision


def _policy_decision(
    call: ToolCall, *, looked_up: bool, lookup_failed: str | None
) -> RecoveryDecision:
    """The pinned policy alone (``executing_decision`` without the tool's own exception)."""
    if call.policy is RecoveryPolicy.INDETERMINATE:
        return Seal("the worker stopped after the call started; its policy never guesses")
    if lookup_failed is not None:
        return Seal(f"the lookup by operation id could not answer: {lookup_failed}")
    if call.policy is RecoveryPolicy.RECONNECT and not looked_up:
        return Lookup()
    if call.attempt < call.max_attempts:
        return Retry(call.attempt + 1)
    return Seal(f"no result after {call.attempt} attempts (budget {call.max_attempts})")
