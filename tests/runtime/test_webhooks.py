"""Webhooks on the database: the outbox is written by the commit's own write (and only by
it), deliveries are claimed in order per run and endpoint, signed, retried and given up."""

from __future__ import annotations

from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from runtime import webhooks
from runtime.commits import commit
from runtime.coordinator import read_frontier
from runtime.domain.commit import CommitDraft, ending
from runtime.domain.model import Disposition, EndCause
from runtime.errors import VersionConflict, WebhookRefused
from runtime.models import Run, WebhookDelivery
from runtime.operations import cancel
from tests.runtime.support import text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)

ALL = ["ticket.opened", "run.ended", "call.indeterminate", "run.paused"]


@pytest.fixture(autouse=True)
def local_receivers(settings):
    """The receivers here are on 127.0.0.1: internal, so allowed by name (README "Webhooks")."""
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]


def deliveries(**filters: Any) -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.filter(**filters).order_by("run_id", "seq", "idx"))


def awaiting_run(start, work_inline) -> str:
    run_id = start(tool_step(("ledger_approval", {"key": "k"})), text_step())
    work_inline()
    assert Run.objects.get(id=run_id).state == "awaiting"
    return run_id


def test_a_ticket_and_a_cancel_write_their_events_with_their_commits(start, work_inline):
    endpoint = webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    quiet = webhooks.create_endpoint(url="http://127.0.0.1:9/other", events=["run.paused"])
    run_id = awaiting_run(start, work_inline)
    (opened,) = deliveries(endpoint=endpoint)
    assert opened.kind == "ticket.opened" and opened.state == "pending"
    data = opened.payload["data"]
    assert data["run_id"] == run_id and data["ticket"]["kind"] == "approval"
    assert data["url"].endswith(f"/runs/{run_id}/")
    assert opened.payload["type"] == "ticket.opened"

    cancel(run_id, actor="olga", reason="enough")
    rows = deliveries(endpoint=endpoint)
    assert [r.kind for r in rows] == ["ticket.opened", "call.indeterminate", "run.ended"]
    ended = rows[-1].payload["data"]
    assert ended["end_cause"] == "cancelled" and ended["actor"] == "olga"
    assert rows[1].seq == rows[2].seq and rows[1].idx < rows[2].idx  # one commit, in order
    assert rows[1].payload["data"]["call"]["name"] == "ledger_approval"
    assert deliveries(endpoint=quiet) == []  # subscribed to nothing that happened


def test_a_disabled_endpoint_or_none_gets_no_rows(start, work_inline):
    webhooks.update_endpoint(
        webhooks.create_endpoint(url="http://127.0.0.1:9/", events=ALL).id, enabled=False
    )
    run_id = start(text_step())
    work_inline()
    assert Run.objects.get(id=run_id).end_cause == "natural"
    assert deliveries() == []


def test_a_commit_refused_by_its_write_leaves_no_event(start, work_inline):
    """A writer that decided on a stale frontier is refused by the write itself; the events
    its commit would have owed are not in the outbox (one transaction, one statement on
    PostgreSQL)."""
    endpoint = webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    run_id = awaiting_run(start, work_inline)
    row = Run.objects.get(id=run_id)
    head, before = read_frontier(row.thread_id, run_id)
    assert before is not None
    cancel(run_id, reason="first")  # moves the thread on
    events, messages = ending(before, "stale")
    stale = CommitDraft(
        thread_id=row.thread_id,
        run_id=run_id,
        expected_version=head.version,
        disposition=Disposition.ended(EndCause.CANCELLED, {"reason": "stale"}),
        messages=messages,
        events=events,
        actor="stale",
    )
    with pytest.raises(VersionConflict):
        commit(stale, head=head, before=before)
    assert [
        r.payload["data"]["actor"] for r in deliveries(endpoint=endpoint, kind="run.ended")
    ] == [""]


def test_signatures_verify_with_the_standard_library(start, work_inline):
    endpoint = webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    awaiting_run(start, work_inline)
    (due,) = webhooks.claim_due("w", 10)
    body, headers = webhooks.signed_request(due)
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(endpoint.secret).verify(body, headers)["data"]["id"] == due.message_id
    with pytest.raises(Exception):  # noqa: B017 - another secret does not verify
        Webhook(webhooks.create_endpoint(url="http://x.test/", events=ALL).secret).verify(
            body, headers
        )


def answer(status: int | None, error: str = "") -> webhooks.Answer:
    from django.utils import timezone

    return webhooks.Answer(status, error, timezone.now(), 0.01)


def test_a_runs_events_are_claimed_one_at_a_time_in_commit_order(start, work_inline):
    webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    run_id = awaiting_run(start, work_inline)
    cancel(run_id)
    kinds = []
    for _ in range(3):
        (due,) = webhooks.claim_due("w", 10)  # only the earliest pending one is claimable
        assert webhooks.claim_due("other", 10) == []  # leased
        kinds.append(due.payload["type"])
        assert webhooks.record(due, answer(204), worker_id="w") == "delivered"
    assert kinds == ["ticket.opened", "call.indeterminate", "run.ended"]
    assert webhooks.claim_due("w", 10) == []


def test_failures_back_off_then_give_up_and_the_next_event_goes(start, work_inline, settings):
    settings.RUNTIME_WEBHOOK_BACKOFF_SECONDS = 0
    settings.RUNTIME_WEBHOOK_MAX_ATTEMPTS = 2
    endpoint = webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    run_id = awaiting_run(start, work_inline)
    cancel(run_id)
    (due,) = webhooks.claim_due("w", 10)
    assert webhooks.record(due, answer(500, "boom"), worker_id="w") == "retry"
    (again,) = webhooks.claim_due("w", 10)
    assert again.id == due.id and again.attempt == 2
    assert webhooks.record(again, answer(None, "ConnectError"), worker_id="w") == "failed"
    first = WebhookDelivery.objects.get(id=due.id)
    assert first.state == "failed" and first.last_error == "ConnectError"
    log = webhooks.delivery_document(first)["log"]
    assert [(a["status_code"], a["outcome"]) for a in log] == [(500, "retry"), (None, "failed")]
    (following,) = webhooks.claim_due("w", 10)  # given up: the run's next event goes
    assert following.payload["type"] == "call.indeterminate"
    assert following.endpoint_id == endpoint.id


def test_a_stale_attempt_is_logged_but_does_not_settle_a_reclaimed_delivery(
    start, work_inline, settings
):
    settings.RUNTIME_WEBHOOK_TIMEOUT_SECONDS = 0.1
    webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    awaiting_run(start, work_inline)
    (due,) = webhooks.claim_due("slow", 10)
    WebhookDelivery.objects.filter(id=due.id).update(lease_expires_at=None)  # lapsed
    (retaken,) = webhooks.claim_due("fast", 10)
    webhooks.record(due, answer(200), worker_id="slow")
    assert WebhookDelivery.objects.get(id=due.id).state == "pending"  # fenced
    webhooks.record(retaken, answer(200), worker_id="fast")
    assert WebhookDelivery.objects.get(id=due.id).state == "delivered"


def test_the_send_test_button_queues_one_signed_test_event():
    endpoint = webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=["run.ended"])
    webhooks.update_endpoint(endpoint.id, enabled=False)
    delivery = webhooks.send_test(endpoint.id, actor="olga")
    (due,) = webhooks.claim_due("w", 10)  # sent even to a disabled endpoint
    assert due.id == delivery.id and due.payload["type"] == "webhook.test"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": "ftp://x/", "events": ALL},
        {"url": "http://x.test/", "events": []},
        {"url": "http://x.test/", "events": ["run.started"]},
        {"url": "http://x.test/", "events": ALL, "secret": "whsec_short"},
    ],
)
def test_a_bad_endpoint_is_refused_and_nothing_is_written(kwargs):
    with pytest.raises(WebhookRefused):
        webhooks.create_endpoint(**kwargs)
    assert not webhooks.WebhookEndpoint.objects.exists()


def test_a_natural_end_is_one_event(start, work_inline):
    webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=ALL)
    run_id = start(text_step())
    work_inline()
    assert [r.kind for r in deliveries(run_id=run_id)] == ["run.ended"]
