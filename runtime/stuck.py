"""Why a run is where it is: who holds it, what it waits on, and a timeline of its log.

Read-only. ``holders`` says, for Running runs, which worker holds each (its last heartbeat and
the lease's expiry) or that no live worker does and when the run will be taken over; it reads
the operational rows (Run's lease columns, WorkerProcess), which are never thread truth but
are what an operator needs to see when a worker died. ``waiting`` says what a run waits on
and since when, from committed facts (commit times, tickets, executor attempts). ``timeline``
lists every step and call of a run with durations, attempts and who answered each ticket,
from the run's ThreadCommit rows alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from django.utils import timezone

from runtime import conf, versions
from runtime.models import Run, ThreadCommit, Ticket, WorkerProcess

HolderStatus = Literal["owned", "owner_silent", "lease_expired", "unclaimed"]


def heartbeat_overdue() -> timedelta:
    """How long an owner may be silent before it counts as not alive: two heartbeat periods
    and a second (RUNTIME_HEARTBEAT_SECONDS), never more than the lease itself."""
    return min(timedelta(seconds=2 * conf.heartbeat_seconds() + 1), conf.lease_ttl())


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a Running run, in facts and in words.

    ``status``: "owned" (a worker holds the lease and its heartbeat is fresh),
    "owner_silent" (the lease still runs but its worker stopped beating: killed, stopped or
    unregistered), "lease_expired" (a lease named a worker but expired) or "unclaimed" (no
    lease). ``takeover_at`` is when another worker may claim it (the lease's expiry, or now).
    ``live_workers`` counts the workers alive now; with none, nobody takes it over.
    """

    status: HolderStatus
    owner: str | None
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None
    takeover_at: datetime | None
    live_workers: int
    unserved: str = ""  # why no live worker may drive its agent's version (runtime.versions)

    @property
    def alive(self) -> bool:
        return self.status == "owned"

    @property
    def summary(self) -> str:
        """One line an operator reads on the runs list."""
        if self.status == "owned":
            return f"worker {self.owner}"
        if self.unserved:  # nobody takes it over until such a worker runs
            return self.unserved
        if self.live_workers == 0:
            return "no live worker: nobody will take it over until a worker runs"
        when = self.takeover_at.strftime("%H:%M:%S UTC") if self.takeover_at else "now"
        return f"no live worker: will be taken over at {when}"


def _live_workers(now: datetime) -> int:
    silent = now - heartbeat_overdue()
    return WorkerProcess.objects.filter(stopped_at__isnull=True, heartbeat_at__gte=silent).count()


def holders(runs: Iterable[Run], now: datetime | None = None) -> dict[str, Holder]:
    """``{run id: Holder}`` for the Running runs among ``runs`` that are not paused (others
    are left out: a paused run waits for an operator, not a worker): three queries whatever
    the number of runs (their owners' rows, the live workers, the versions they carry)."""
    now = now or timezone.now()
    running = [r for r in runs if r.state == "running" and not r.paused]
    if not running:
        return {}
    owners = {r.lease_owner for r in running if r.lease_owner}
    workers = {
        w.id: w for w in WorkerProcess.objects.filter(id__in=owners)
    }  # a handful: the owners of one page of runs
    live = _live_workers(now)
    unserved = versions.reasons(running)
    found: dict[str, Holder] = {}
    silent = now - heartbeat_overdue()
    for run in running:
        worker = workers.get(run.lease_owner or "")
        beat = worker.heartbeat_at if worker else None
        expires = run.lease_expires_at
        if run.lease_owner is None or expires is None:
            status: HolderStatus = "unclaimed"
            takeover = now
        elif expires <= now:
            status, takeover = "lease_expired", now
        elif worker is None or worker.stopped_at is not None or beat is None or beat < silent:
            status, takeover = "owner_silent", expires
        else:
            status, takeover = "owned", expires
        found[run.id] = Holder(
            status=status,
            owner=run.lease_owner,
            heartbeat_at=beat,
            lease_expires_at=expires,
            takeover_at=takeover,
            live_workers=live,
            unserved=unserved.get(run.id, ""),
        )
    return found


# -- what a run waits on ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a run waits on, since when, in words; and its pending call, when it has one.

    ``on``: "resume" (an operator paused it), "ticket" (an approval, an input, a timer, a
    child), "call" (a call is executing or next to run), "limit" (held back: a slot of a run
    or model limit, README "Limits", a model's budget, or no live worker that may drive its
    agent's version), "model" (the next inference), "children" (calls awaiting child
    runs), or "nothing" (ended). ``since`` is the committed moment the wait began. ``call`` is the
    first call of the open batch that is not terminal: {"call_id", "index", "name", "phase",
    "attempt", "max_attempts", "started_at"} (``started_at``: its latest attempt's commit).
    """

    on: str
    what: str
    since: datetime | None
    call: dict[str, Any] | None = None

    def waited(self, now: datetime | None = None) -> timedelta | None:
        return (now or timezone.now()) - self.since if self.since else None


def _attempt_starts(commits: Sequence[ThreadCommit]) -> dict[str, list[dict[str, Any]]]:
    starts: dict[str, list[dict[str, Any]]] = {}
    for c in commits:
        for e in c.events:
            if e.get("type") == "CallExecuting":
                starts.setdefault(e["call_id"], []).append(
                    {
                        "attempt": e["attempt"],
                        "worker": e.get("worker", ""),
                        "seq": c.seq,
                        "at": c.created_at,
                    }
                )
    return starts


def waiting(doc: dict[str, Any], commits: Sequence[ThreadCommit]) -> Waiting:
    """What the run of ``doc`` (its run document) waits on, from its committed log
    ``commits`` (oldest first) and its document's tickets."""
    last = commits[-1].created_at if commits else None
    if doc["state"] == "ended":
        return Waiting(on="nothing", what="it has ended", since=last)
    batch = next((b for b in doc["batches"] if not b["finalized"]), None)
    pending = None
    if batch is not None:
        pending = next(
            (c for c in batch["calls"] if c["phase"] not in ("completed", "indeterminate")),
            None,
        )
    call = None
    if pending is not None:
        attempts = _attempt_starts(commits).get(pending["call_id"], [])
        call = {
            "call_id": pending["call_id"],
            "index": pending["index"],
            "name": pending["name"],
            "phase": pending["phase"],
            "attempt": pending["attempt"],
            "max_attempts": pending["max_attempts"],
            "started_at": attempts[-1]["at"] if attempts else None,
            "worker": attempts[-1]["worker"] if attempts else "",
        }
    pause = doc.get("pause")
    if pause:  # nothing moves until an operator resumes it (its ticket stays answerable)
        at = pause.get("paused_at")
        since = datetime.fromisoformat(at) if at else last
        return Waiting(
            on="resume", what=f"an operator to resume it ({pause['line']})", since=since, call=call
        )
    ticket = doc.get("ticket")
    if ticket is not None:
        opened = Ticket.objects.filter(id=ticket["id"]).values_list("created_at", flat=True)
        kind = ticket["kind"]
        named = next(
            (
                f"#{c['index']} {c['name']}"
                for b in doc["batches"]
                for c in b["calls"]
                if c["call_id"] == ticket["call_id"]
            ),
            "a call",
        )
        what = {
            "approval": f"a person to approve or deny {named}",
            "input": f"a person to answer {named}",
            "timer": f"the timer of {named}, due {ticket.get('due_at') or '?'}",
            "delegation": f"child run {ticket['request'].get('child_run_id', '?')} of {named}",
        }.get(kind, f"its {kind} ticket")
        return Waiting(on="ticket", what=what, since=opened.first() or last, call=call)
    if doc.get("waiting"):  # held back (a limit, a model's budget, no worker of its version)
        return Waiting(on="limit", what=doc["waiting"].removeprefix("waiting for "), since=last)
    if call is not None:
        if call["phase"] == "executing":
            what = f"call #{call['index']} {call['name']} (attempt {call['attempt']}) to finish"
            return Waiting(on="call", what=what, since=call["started_at"] or last, call=call)
        children = {t["call_id"] for t in doc["tickets"] if t["kind"] == "delegation"}
        if call["phase"] == "awaiting" and call["call_id"] in children:
            return Waiting(on="children", what="its child runs to end", since=last, call=call)
        what = f"a worker to start call #{call['index']} {call['name']}"
        return Waiting(on="call", what=what, since=last, call=call)
    return Waiting(on="model", what=f"the model's answer for step {doc['step'] + 1}", since=last)


# -- the timeline ---------------------------------------------------------------------------


@dataclass
class CallSpan:
    """One call on the timeline: when it started and ended (committed), its attempts, and
    the answers its tickets got."""

    call_id: str
    index: int
    name: str
    number: int  # run-wide, from 1, in step and call order
    requested_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration(self) -> timedelta | None:
        start = self.started_at or self.requested_at
        return self.ended_at - start if self.ended_at else None


@dataclass
class StepSpan:
    """One step on the timeline: the inference (from the previous boundary to the commit of
    its answer), then its batch's calls and its publication."""

    step: int
    asked_at: datetime
    answered_at: datetime
    finalized_at: datetime | None = None
    calls: list[CallSpan] = field(default_factory=list)

    @property
    def inference(self) -> timedelta:
        return self.answered_at - self.asked_at

    @property
    def duration(self) -> timedelta | None:
        end = self.finalized_at if self.calls else self.answered_at
        return end - self.asked_at if end else None


def _outcome(event: dict[str, Any], actor: str = "") -> str:
    """How a call's terminal event ended it: "completed", "error", "indeterminate", "denied"
    (a person's deny), "answered" (an input, or a child's answer), "responded", or "" (an
    approval or a timer's fire, after which the call runs). A child's end other than
    natural is a deny from the runtime: "error"."""
    kind = event.get("type")
    if kind == "CallIndeterminate":
        return "indeterminate"
    if kind == "CallCompleted":
        return "error" if event.get("is_error") else "completed"
    decision = event.get("decision")
    if decision == "deny" and actor.startswith(("child:", "parent:", "timer")):
        return "error"
    return {"deny": "denied", "input": "answered", "respond": "responded"}.get(str(decision), "")


def timeline(commits: Sequence[ThreadCommit], run_id: str) -> list[StepSpan]:
    """Every step and call of ``run_id`` from its commits (oldest first, the run's own):
    inference times, call starts, ends and attempts, and who answered each ticket (the actor
    of the commit that consumed it) with the decision."""
    steps: list[StepSpan] = []
    calls: dict[str, CallSpan] = {}
    number = 0
    boundary = commits[0].created_at if commits else None
    for c in commits:
        if c.run_id != run_id:
            continue
        for e in c.events:
            kind = e.get("type")
            if kind == "StepCommitted":
                steps.append(
                    StepSpan(
                        step=e["step"], asked_at=boundary or c.created_at, answered_at=c.created_at
                    )
                )
            elif kind == "BatchOpened" and steps:
                for call in e["calls"]:
                    number += 1
                    span = CallSpan(
                        call_id=call["call_id"],
                        index=call["index"],
                        name=call["name"],
                        number=number,
                        requested_at=c.created_at,
                    )
                    calls[span.call_id] = span
                    steps[-1].calls.append(span)
            elif kind == "CallExecuting" and e["call_id"] in calls:
                span = calls[e["call_id"]]
                span.started_at = span.started_at or c.created_at
                span.attempts.append(
                    {"attempt": e["attempt"], "worker": e.get("worker", ""), "at": c.created_at}
                )
            elif kind in ("CallAwaiting", "ChildStarted") and e["call_id"] in calls:
                span = calls[e["call_id"]]
                span.started_at = span.started_at or c.created_at
            elif kind == "CallResumed" and e["call_id"] in calls:
                span = calls[e["call_id"]]
                span.answers.append(
                    {
                        "decision": e.get("decision"),
                        "actor": c.actor,
                        "at": c.created_at,
                        "seq": c.seq,
                    }
                )
                if (outcome := _outcome(e, c.actor)) != "":
                    span.outcome, span.ended_at = outcome, c.created_at
            elif kind in ("CallCompleted", "CallIndeterminate") and e["call_id"] in calls:
                span = calls[e["call_id"]]
                span.outcome, span.ended_at = _outcome(e), c.created_at
            elif kind == "BatchFinalized" and steps:
                steps[-1].finalized_at = c.created_at
        boundary = c.created_at
    return steps
