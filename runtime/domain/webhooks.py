"""What a commit tells the outside world, and when a failed delivery is tried again.

Pure: no Django, no clock, no I/O. ``notifications`` maps one validated commit (the run before
and after, and the draft) to the webhook events it owes, as values; the coordinator writes one
outbox row per (subscribed endpoint, event) in the commit's own write, so an event exists if
and only if its commit does (issue 23, item 3). ``next_attempt`` is the retry decision the
delivery task applies (like procrastinate's retry strategies).

Adding an event kind is one ``case`` in ``_from_event`` (or one test in ``notifications``) and
one member of ``WebhookEvent``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from runtime.domain.commit import CommitDraft
from runtime.domain.events import CallIndeterminate, Event, RunPaused
from runtime.domain.model import JSON, ResumeTicket, RunState, RunView, TicketKind


class WebhookEvent(StrEnum):
    """The kinds of event an endpoint subscribes to (its ``events`` list)."""

    TICKET_OPENED = "ticket.opened"  # a person must answer: an approval or an input
    RUN_ENDED = "run.ended"  # with its EndCause
    CALL_INDETERMINATE = "call.indeterminate"  # a call's outcome is unknown
    RUN_PAUSED = "run.paused"  # an operator paused the run (issue 23, item 1)
    TEST = "webhook.test"  # the "send test" button; never from a commit


# The events an endpoint may subscribe to (a test is sent to one endpoint on request).
SUBSCRIBABLE: tuple[WebhookEvent, ...] = tuple(
    e for e in WebhookEvent if e is not WebhookEvent.TEST
)

# Tickets a person answers; a delegation ticket is answered by its child, a timer by time.
PERSON_TICKETS = (TicketKind.APPROVAL, TicketKind.INPUT)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """One webhook event a commit owes: its kind and the committed facts it reports."""

    kind: WebhookEvent
    facts: dict[str, JSON]


def notifications(
    draft: CommitDraft, before: RunView | None, run: RunView | None
) -> tuple[Notification, ...]:
    """The webhook events one commit owes, in a fixed order (events first, in commit order,
    then tickets opened, then the run's end). ``before`` and ``run`` are the commit's run
    before and after (None for a thread note). Pure: the same commit gives the same list."""
    found = [n for event in draft.events for n in _from_event(event, run)]
    if run is not None:
        found += [_ticket_opened(t) for t in _opened(before, run) if t.kind in PERSON_TICKETS]
        if run.state is RunState.ENDED and (before is None or before.state is not RunState.ENDED):
            found.append(_run_ended(run))
    return tuple(found)


def _from_event(event: Event, run: RunView | None) -> Iterator[Notification]:
    """The webhook events one committed event owes (the place to wire a new fact kind)."""
    match event:
        case CallIndeterminate(call_id=call_id, reason=reason):
            call = run.find_call(call_id) if run else None
            yield Notification(
                kind=WebhookEvent.CALL_INDETERMINATE,
                facts={
                    "call": {
                        "id": call_id,
                        "name": call.name if call else None,
                        "operation_id": call.operation_id if call else None,
                        "effect_may_have_started": bool(call and call.effect_may_have_started),
                        "reason": reason,
                    }
                },
            )
        case RunPaused(ticket=ticket):
            yield Notification(
                kind=WebhookEvent.RUN_PAUSED,
                facts={"pause": {"ticket_id": ticket.id, **ticket.request}},
            )
        case _:
            return


def _opened(before: RunView | None, run: RunView) -> list[ResumeTicket]:
    def open_of(view: RunView | None) -> dict[str, ResumeTicket]:
        if view is None:
            return {}
        return {t.id: t for t in ((view.ticket,) if view.ticket else ()) + view.waits}

    old, new = open_of(before), open_of(run)
    return [new[i] for i in sorted(new.keys() - old.keys())]


def _ticket_opened(ticket: ResumeTicket) -> Notification:
    return Notification(
        kind=WebhookEvent.TICKET_OPENED,
        facts={
            "ticket": {
                "id": ticket.id,
                "kind": ticket.kind.value,
                "call_id": ticket.call_id,
                "request": ticket.request,
            }
        },
    )


def _run_ended(run: RunView) -> Notification:
    return Notification(
        kind=WebhookEvent.RUN_ENDED,
        facts={"end_cause": run.end_cause.value if run.end_cause else None, "error": run.error},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """Try again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True, kw_only=True)
class GiveUp:
    """Stop: the delivery is failed after ``attempts`` attempts."""

    attempts: int


def next_attempt(
    attempts: int, *, max_attempts: int, base: float, cap: float, jitter: float
) -> Retry | GiveUp:
    """Decide what follows failed attempt number ``attempts`` (1 for the first).

    Exponential backoff with "full jitter" kept above half (AWS's architecture blog's
    "equal jitter"): ``min(cap, base * 2**(attempts-1))`` times a factor in [0.5, 1],
    ``jitter`` being a uniform draw in [0, 1] supplied by the caller (pure: no randomness
    here). After ``max_attempts`` attempts the delivery is given up.
    """
    if attempts >= max_attempts:
        return GiveUp(attempts=attempts)
    ceiling = min(cap, base * 2 ** (attempts - 1))
    return Retry(delay=ceiling * (0.5 + 0.5 * min(max(jitter, 0.0), 1.0)))


def message_id(thread_id: str, seq: int, idx: int) -> str:
    """The ``webhook-id`` of the ``idx``-th event of commit ``seq`` of a thread: the same for
    every endpoint and attempt, so a receiver deduplicates redeliveries by it."""
    return f"msg_{thread_id}_{seq}_{idx}"


def body(
    notification: Notification,
    *,
    message: str,
    run: RunView | None,
    thread_id: str,
    seq: int,
    actor: str,
    at: str,
    url: str | None,
) -> dict[str, JSON]:
    """The JSON body of one event, in Standard Webhooks' shape ``{"type", "timestamp",
    "data"}``. ``data`` holds the run's ids and console link (``url``), the commit (``seq``,
    ``actor``, ``committed_at`` = ``at``, ISO 8601 UTC) and the event's committed facts."""
    data: dict[str, JSON] = {
        "id": message,
        "run_id": run.run_id if run else None,
        "thread_id": thread_id,
        "agent": run.agent if run else None,
        "url": url,
        "seq": seq,
        "actor": actor,
        "committed_at": at,
        "state": run.state.value if run else None,
        **notification.facts,
    }
    return {"type": notification.kind.value, "timestamp": at, "data": data}
