"""The commit log and its projections in the ORM.

ThreadCommit rows are the authority: append-only, sequence unique per thread. Thread, Run,
ToolCallRecord, Ticket, MessageRecord and ReconciliationRecord are projections written by the
coordinator in the same transaction; folding the log must reproduce them (``runtime_fsck``).
Leases, stream checkpoints, idempotency records and late evidence are operational rows, never
thread truth.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models import Q


def python_source() -> dict[str, str]:
    """The source of a call to a Python tool (and of calls logged before sources existed)."""
    return {"kind": "python"}


def new_id() -> str:
    return uuid.uuid4().hex


class Thread(models.Model):
    id = models.CharField(primary_key=True, max_length=32, default=new_id, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    version = models.PositiveBigIntegerField(default=0)  # sequence of the last commit
    active_run = models.ForeignKey(
        "Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["active_run"], name="thread_active_run")]

    def __str__(self) -> str:
        return f"thread {self.id}"


class RunQuerySet(models.QuerySet["Run"]):
    def runnable(self, now) -> RunQuerySet:
        """Running runs that are not paused, whose lease is free or expired and that wait for
        no model's budget."""
        return self.filter(state="running", paused=False).filter(
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
            Q(wait_until__isnull=True) | Q(wait_until__lte=now),
        )

    def driven(self, now, driving: tuple[str, ...] = ()) -> RunQuerySet:
        """Running runs that a worker holds a live lease of (or that ``driving`` names: the
        caller's own, whose lease its next heartbeat renews): the runs holding a slot."""
        return self.filter(state="running").filter(Q(lease_expires_at__gte=now) | Q(id__in=driving))


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=32, default=new_id, editable=False)
    # Indexed by run_thread (Meta), which also serves thread id prefixes (search).
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    agent = models.CharField(max_length=100)
    state = models.CharField(max_length=16, default="running")
    end_cause = models.CharField(max_length=16, null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    version = models.PositiveBigIntegerField(default=0)  # sequence of its last commit
    step = models.PositiveIntegerField(default=0)
    snapshot = models.JSONField(default=dict)  # the folded RunView
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    committed_at = models.DateTimeField(null=True, blank=True)  # time of its last commit
    # Operational: the lease of the worker that owns the run now.
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.PositiveIntegerField(default=0)
    # Poison accounting since the last commit: every claim, and the claims whose driving
    # failed in a way that points at the run (an exception), as opposed to a lost worker.
    claims = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    # Operational: a run released to wait for a model's budget is not claimed before
    # ``wait_until``; ``waiting`` says why (runtime.limits).
    wait_until = models.DateTimeField(null=True, blank=True)
    waiting = models.CharField(max_length=300, blank=True, default="")
    # The deployed version of its agent it started with (Agent.deployed_version, issue 34).
    agent_version = models.CharField(max_length=100, blank=True, default="")
    # Operational: when its model began to fail retryably in the step it is on (a model
    # outage, issue 31 item 6); a time before ``committed_at`` belongs to an earlier step.
    model_unavailable_since = models.DateTimeField(null=True, blank=True)
    # Operational: the OpenTelemetry trace id, once a traced worker drove it (runtime.tracing).
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # A child Run (delegation): its parent run and the delegate call it answers.
    parent_run_id = models.CharField(max_length=32, null=True, blank=True, db_index=True)
    parent_call_id = models.CharField(max_length=32, null=True, blank=True)
    depth = models.PositiveIntegerField(default=0)
    plugin_state = models.JSONField(default=dict, blank=True)  # committed, by plugin key
    # The run holds an open pause ticket (RunView.pause, whose request says who, when, why):
    # no worker claims it until an operator resumes it.
    paused = models.BooleanField(default=False)
    # A fork (runtime.fork): the run it was forked from, as its activation's
    # ``metadata.forked_from.run_id`` says; a column so a run's forks are an index lookup.
    # Not a foreign key: the source may be pruned before its forks.
    forked_from = models.CharField(max_length=32, null=True, blank=True)
    # Not columns: the console's runs list sets these on the rows it shows (_row_context).
    input_line: str
    waits_for: str
    needs_reconciliation: bool
    holder: Any  # runtime.stuck.Holder | None

    objects = RunQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["state", "-created_at"], name="run_state_recent"),
            models.Index(fields=["-created_at", "-id"], name="run_recent"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_recent"),
            models.Index(fields=["end_cause", "-created_at"], name="run_cause_recent"),
            models.Index(fields=["state", "lease_expires_at"], name="run_runnable"),
            # A claim takes the Running run with the oldest commit: an ordered index scan.
            models.Index(
                fields=["committed_at"], name="run_claim_order", condition=Q(state="running")
            ),
            # The runs list counts runs per (state, end cause) with an index-only scan.
            models.Index(fields=["state", "end_cause"], name="run_state_cause"),
            # The chips' capped counts under an agent filter (console.views.runs._counts).
            models.Index(fields=["agent", "state", "end_cause"], name="run_agent_state_cause"),
            # The runs list's "paused" filter and the paused-runs gauge.
            models.Index(
                fields=["-created_at"], name="run_paused_recent", condition=Q(paused=True)
            ),
            # A run's forks, oldest first (the run page, the API's run document).
            models.Index(
                fields=["forked_from", "created_at", "id"],
                name="run_forks",
                condition=Q(forked_from__isnull=False),
            ),
            # The versions runs not ended are on, one probe per version (a loose scan:
            # runtime.versions.open_versions), and a version's runs oldest first (moves).
            models.Index(
                fields=["agent", "agent_version", "created_at", "id"],
                name="run_open_version",
                condition=Q(state__in=["running", "awaiting"]),
            ),
            # The workers page: the runs a worker holds are running ones.
            models.Index(
                fields=["lease_owner", "committed_at"],
                name="run_held",
                condition=Q(state="running"),
            ),
            # Audit's "run cancelled" entries, newest first (the cancel is the run's last
            # commit, so the run's committed_at is that commit's time).
            models.Index(
                fields=["-committed_at"],
                name="run_cancelled_recent",
                condition=Q(end_cause="cancelled"),
            ),
            # Prune walks ended runs oldest commit first (runtime.retention).
            models.Index(
                fields=["committed_at", "id"], name="run_ended_order", condition=Q(state="ended")
            ),
            # A thread's runs, and runs whose thread id starts with a search's text: one index
            # (PostgreSQL's pattern operator class answers equality too; migration 0025).
            models.Index(fields=["thread"], name="run_thread", opclasses=["varchar_pattern_ops"]),
            # PostgreSQL also has a GIN index on metadata (migration 0017) for the metadata
            # filter (runtime.search); not declared here, as SQLite has no GIN.
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.state})"


class RunCount(models.Model):
    """How many runs have one (agent, state, end cause) (``end_cause`` "" until a run ends).

    Written only by the database's triggers on ``runtime_run`` (migration 0018), in the
    transaction of each write that inserts, deletes or changes a run's agent, state or end
    cause; read by /metrics and the runs list's chips, which then count a few rows instead
    of every run. ``n`` is the sum over a key's row (a key whose runs all moved stays at 0).
    """

    agent = models.CharField(max_length=100)
    state = models.CharField(max_length=16)
    end_cause = models.CharField(max_length=16, blank=True, default="")
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "state", "end_cause"], name="runcount_key")
        ]


# The event types of an operator's commits of their own that keep the run's disposition (a
# pause, a resume, a move to another version: runtime.operations), by name.
OPERATOR_EVENTS = ("RunPaused", "RunResumed", "RunMoved")


class ThreadCommit(models.Model):
    """One validated write: a RunDisposition with messages and events."""

    # Both keys are the first columns of an index below (no index of their own: migration 0025).
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="commits", db_index=False
    )
    seq = models.PositiveBigIntegerField()
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="commits",
        db_index=False,
    )
    disposition = models.JSONField(null=True, blank=True)
    messages = models.JSONField(default=list)
    events = models.JSONField(default=list)
    actor = models.CharField(max_length=200, blank=True, default="")
    # The deployed version of the agent whose code wrote it: a worker's commit (issue 34).
    agent_version = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["thread", "seq"], name="commit_seq_unique_per_thread"),
            # A disposition belongs to a run's commit; only a thread note has neither. The
            # coordinator relies on this to undo a commit whose run did not match.
            models.CheckConstraint(
                condition=Q(run__isnull=False) | Q(disposition__isnull=True),
                name="commit_disposition_needs_run",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "seq"], name="commit_run_seq"),
            # The threads with a commit since a time (runtime_fsck --since).
            models.Index(fields=["created_at"], name="commit_created"),
            # Audit's pause, resume and move entries: the commits whose first event is one of
            # OPERATOR_EVENTS (such a commit carries that event alone).
            models.Index(
                fields=["-created_at"],
                name="commit_operator_recent",
                condition=Q(events__0__type__in=OPERATOR_EVENTS),
            ),
        ]

    def __str__(self) -> str:
        return f"commit {self.thread_id}#{self.seq}"


class MessageRecord(models.Model):
    # Indexed by message_order_unique and message_run (migration 0025).
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages", db_index=False)
    seq = models.PositiveBigIntegerField()  # the commit that carried it
    idx = models.PositiveIntegerField()  # order within that commit
    role = models.CharField(max_length=16)
    content = models.TextField(blank=True, default="")
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=200, null=True, blank=True)
    name = models.CharField(max_length=200, null=True, blank=True)
    meta = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["thread", "seq", "idx"]
        constraints = [
            models.UniqueConstraint(fields=["thread", "seq", "idx"], name="message_order_unique")
        ]
        indexes = [models.Index(fields=["run"], name="message_run")]


class ToolCallRecord(models.Model):
    id = models.CharField(primary_key=True, max_length=32)  # the call id
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="calls", db_index=False)
    step = models.PositiveIntegerField()
    index = models.PositiveIntegerField()
    tool_call_id = models.CharField(max_length=200)
    name = models.CharField(max_length=200)
    # What the call runs with: the model's, or an operator's approved edit, which then keeps
    # the model's in model_arguments (runtime.domain.model.ToolCall).
    arguments = models.JSONField(null=True, blank=True)
    arguments_text = models.TextField(blank=True, default="")
    model_arguments = models.JSONField(null=True, blank=True)
    operation_id = models.CharField(max_length=100, unique=True)
    policy = models.CharField(max_length=16)
    permission = models.CharField(max_length=8)
    max_attempts = models.PositiveIntegerField(default=1)
    # Where the tool came from, pinned with the batch: {"kind": "python"} or {"kind": "mcp",
    # "server", "tool", ...} (runtime.domain.model.ToolCall.source).
    source = models.JSONField(default=python_source)
    # Whether the tool changes anything outside (none | idempotent | once), pinned with the
    # batch (runtime.domain.model.Effects); "once" for calls logged before it was declared.
    effects = models.CharField(max_length=16, default="once")
    phase = models.CharField(max_length=16)
    attempt = models.PositiveIntegerField(default=0)
    approved = models.BooleanField(default=False)
    ticket_id = models.CharField(max_length=32, null=True, blank=True)
    result = models.TextField(null=True, blank=True)
    is_error = models.BooleanField(default=False)
    effect_may_have_started = models.BooleanField(default=False)
    batch_finalized = models.BooleanField(default=False)
    # Set when the call's batch is committed and never changed: lists page on it (with the
    # id), so a call that changes while a client walks the pages keeps its place.
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "step", "index"]
        indexes = [
            models.Index(
                fields=["phase", "-updated_at"],
                name="call_indeterminate_started",
                condition=Q(phase="indeterminate", effect_may_have_started=True),
            ),
            models.Index(fields=["phase", "-created_at", "-id"], name="call_phase_created"),
            models.Index(fields=["-created_at", "-id"], name="call_created"),
            models.Index(fields=["run"], name="call_run"),
        ]


class Ticket(models.Model):
    id = models.CharField(primary_key=True, max_length=32)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tickets", db_index=False)
    call = models.ForeignKey(
        ToolCallRecord, on_delete=models.CASCADE, related_name="tickets", db_index=False
    )
    kind = models.CharField(max_length=16)
    request = models.JSONField(default=dict, blank=True)
    schema = models.JSONField(null=True, blank=True)
    state = models.CharField(max_length=16, default="open")  # open | consumed | void
    created_at = models.DateTimeField(auto_now_add=True)
    opened_seq = models.PositiveBigIntegerField()
    closed_seq = models.PositiveBigIntegerField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.CharField(max_length=200, blank=True, default="")
    decision = models.CharField(max_length=16, blank=True, default="")
    due_at = models.DateTimeField(null=True, blank=True)  # timer tickets: when it fires (UTC)
    # Not columns: the console sets these on the closed tickets it shows (attach_notes).
    note: str
    edited_arguments: Any

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"], name="ticket_open_oldest", condition=Q(state="open")
            ),
            models.Index(
                fields=["due_at"], name="ticket_timer_due", condition=Q(state="open", kind="timer")
            ),
            # The API's keyset pages of every ticket, oldest first (console.api.pagination).
            models.Index(fields=["created_at", "id"], name="ticket_created"),
            # Recently closed tickets, newest first (the inbox's "recent", audit's answers).
            models.Index(
                fields=["-closed_at"], name="ticket_closed_recent", condition=~Q(state="open")
            ),
            models.Index(fields=["run"], name="ticket_run"),
            models.Index(fields=["call"], name="ticket_call"),
        ]


class ReconciliationRecord(models.Model):
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="reconciliations")
    call = models.ForeignKey(
        ToolCallRecord, on_delete=models.CASCADE, related_name="reconciliations"
    )
    seq = models.PositiveBigIntegerField()
    outcome = models.CharField(max_length=16)
    evidence = models.TextField(blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # Not a column: the console sets it on the records it shows (mark_corrections).
    corrects: ReconciliationRecord | None

    class Meta:
        # Audit's reconciliation entries, newest first (console.views.audit).
        indexes = [models.Index(fields=["-created_at"], name="reconciliation_recent")]


class LateEvidence(models.Model):
    """A tool result reported after its call was sealed: kept for reconciliation, never
    published."""

    call = models.ForeignKey(ToolCallRecord, on_delete=models.CASCADE, related_name="evidence")
    result = models.TextField()
    is_error = models.BooleanField(default=False)
    worker = models.CharField(max_length=200, blank=True, default="")
    attempt = models.PositiveIntegerField(default=0)  # the executor attempt that produced it
    created_at = models.DateTimeField(auto_now_add=True)


class CommandRecord(models.Model):
    """The first answer to an operator command on a run sent with an idempotency key (a
    start or a fork, which has no run before it: StartRecord)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="command_records")
    key = models.CharField(max_length=200)
    request_hash = models.CharField(max_length=64)
    response = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="command_key_unique_per_run")
        ]


class StartRecord(models.Model):
    """The run that a start or a fork sent with an idempotency key created.

    A start has no run before it, so its key is scoped to its actor (the user a token acts
    as): ``(actor, key)`` is unique. The record is written in the transaction that creates
    the run, so the key is recorded exactly when the run exists, and it goes with the run
    (CASCADE: a prune of the run's thread deletes it).
    """

    actor = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    request_hash = models.CharField(max_length=64)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="start_records")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["actor", "key"], name="start_key_unique_per_actor")
        ]


class StreamCheckpoint(models.Model):
    """Best-effort partial output of an inference in progress; never thread truth."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="checkpoint")
    step = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(default=1)
    # The lease epoch of the claim that streamed it: a late viewer tells its text from a
    # takeover's, whose deltas start afresh (issue 22, defect 4).
    claim = models.PositiveIntegerField(null=True, blank=True)
    text = models.TextField(blank=True, default="")
    tool_calls = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class WorkerProcess(models.Model):
    """A worker process as it registered itself: operational, never thread truth.

    ``heartbeat_at`` moves every RUNTIME_HEARTBEAT_SECONDS while the process lives; the runs
    it holds are the runs whose lease names it (``Run.lease_owner``).
    """

    id = models.CharField(primary_key=True, max_length=200)  # the worker id
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField(default=1)
    version = models.CharField(max_length=100, blank=True, default="")
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Why the worker cannot work now ("" while it can): the database is unreachable, or its
    # connection pool is exhausted (written when a connection allows, cleared on recovery).
    problem = models.CharField(max_length=500, blank=True, default="")
    problem_since = models.DateTimeField(null=True, blank=True)
    # {agent name: deployed version} of the agents it carries (runtime.versions, issue 34).
    agents = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["-heartbeat_at"], name="worker_recent")]


class Limit(models.Model):
    """Operational: one row per limited agent ("agent:NAME") or model ("model:NAME").

    An agent's row is the lock its claims take (a row lock on PostgreSQL), so that two
    workers never count the same free slot; a model's row also holds its token bucket and
    the instant a provider's Retry-After pushed its budget to (runtime.limits)."""

    key = models.CharField(primary_key=True, max_length=300)
    tokens = models.FloatField(default=0)
    refilled_at = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)


class ModelSlot(models.Model):
    """Operational: an inference under way of a limited model, by the claim (run, lease
    epoch) that asks it. It counts only while that claim's lease is live, so a worker that
    dies frees its slots when its leases lapse (runtime.limits)."""

    model = models.CharField(max_length=300)
    run_id = models.CharField(max_length=32)
    epoch = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["model"], name="model_slot_model")]


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    import base64
    import secrets

    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class WebhookEndpoint(models.Model):
    """An outgoing webhook's receiver: the event kinds it subscribes to and its signing
    secret (runtime.webhooks). Operational configuration, never thread truth."""

    id = models.CharField(primary_key=True, max_length=32, default=new_id, editable=False)
    name = models.CharField(max_length=100, blank=True, default="")
    url = models.URLField(max_length=2000)
    # The runtime.domain.webhooks.WebhookEvent values it receives.
    events = models.JSONField(default=list)
    secret = models.CharField(max_length=200, default=new_webhook_secret)
    enabled = models.BooleanField(default=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"webhook {self.name or self.id} -> {self.url}"


class WebhookChange(models.Model):
    """One change of a webhook endpoint (``action``: create, enable, disable, rotate, update,
    delete): who made it, when, to which endpoint, and what it affected (``detail``, e.g.
    ``{"pending": 645}`` for a delete). Written by ``runtime.webhooks`` in the change's own
    transaction, kept after the endpoint is deleted; the console's Audit page lists them."""

    endpoint_id = models.CharField(max_length=32)  # not a key: the endpoint may be gone
    endpoint_name = models.CharField(max_length=100, blank=True, default="")
    url = models.CharField(max_length=2000, blank=True, default="")  # as shown, no credentials
    action = models.CharField(max_length=16)
    actor = models.CharField(max_length=200, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["-created_at"], name="webhook_change_recent")]


class WebhookDelivery(models.Model):
    """The outbox: one event for one endpoint, written in the transaction of the commit that
    caused it, then delivered at least once by workers (runtime.webhooks).

    ``message_id`` is the event's ``webhook-id`` (the same for every endpoint and attempt);
    (``run_id``, ``seq``, ``idx``) orders a run's events, and an endpoint receives them in
    that order. ``state``: pending -> delivered | failed.
    """

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    message_id = models.CharField(max_length=100)
    kind = models.CharField(max_length=32)
    run_id = models.CharField(max_length=32, null=True, blank=True)
    thread_id = models.CharField(max_length=32, null=True, blank=True)
    seq = models.PositiveBigIntegerField(default=0)
    idx = models.PositiveIntegerField(default=0)
    payload = models.JSONField()
    state = models.CharField(max_length=16, default="pending")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "message_id"], name="webhook_message_once_per_endpoint"
            )
        ]
        indexes = [
            # Claims take due pending rows; the order check looks for an earlier pending row
            # of the same run and endpoint.
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_due",
                condition=Q(state="pending"),
            ),
            models.Index(
                fields=["endpoint", "run_id", "seq", "idx"],
                name="webhook_run_order",
                condition=Q(state="pending"),
            ),
            models.Index(fields=["endpoint", "-created_at", "-id"], name="webhook_endpoint_log"),
        ]


class WebhookAttempt(models.Model):
    """One attempt to deliver: when, by which worker, the response code or the error."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    outcome = models.CharField(max_length=16)  # delivered | retry | failed

    class Meta:
        ordering = ["delivery", "number"]
