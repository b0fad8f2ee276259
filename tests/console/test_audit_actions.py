"""Issue 32: a webhook endpoint's delete and secret rotation confirm what they affect before
they act, and Audit lists pauses, resumes and webhook changes, with a decision filter that
refuses what it does not know."""

from __future__ import annotations

import pytest
from django.urls import reverse

from runtime import operations, webhooks
from runtime.models import WebhookChange, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def _endpoint_with_pending(count: int) -> WebhookEndpoint:
    endpoint = webhooks.create_endpoint(url="https://h.example/hook", events=["run.ended"])
    for _ in range(count):
        webhooks.send_test(endpoint.id)
    return endpoint


def test_delete_asks_with_the_pending_count_and_writes_nothing_until_confirmed(operator):
    endpoint = _endpoint_with_pending(3)
    asked = operator.post(f"/webhooks/{endpoint.id}/delete/")
    assert asked.status_code == 200
    page = asked.content.decode()
    assert 'data-testid="webhook-question"' in page and "3 pending deliveries" in page
    assert WebhookEndpoint.objects.filter(id=endpoint.id).exists()
    assert WebhookDelivery.objects.filter(endpoint_id=endpoint.id).count() == 3
    assert not WebhookChange.objects.filter(action="delete").exists()

    done = operator.post(f"/webhooks/{endpoint.id}/delete/", {"confirm": "on"})
    assert done.status_code == 302
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()
    change = WebhookChange.objects.get(action="delete")
    assert (change.actor, change.endpoint_id, change.detail) == (
        "olga",
        endpoint.id,
        {"pending": 3},
    )


def test_rotate_asks_first_and_records_who_rotated(operator):
    endpoint = _endpoint_with_pending(1)
    asked = operator.post(f"/webhooks/{endpoint.id}/rotate/")
    assert asked.status_code == 200 and "Replace this endpoint" in asked.content.decode()
    assert WebhookEndpoint.objects.get().secret == endpoint.secret
    assert not WebhookChange.objects.filter(action="rotate").exists()
    refused = operator.post(f"/webhooks/{endpoint.id}/rotate/", {"confirm": ""})
    assert refused.status_code == 400 and WebhookEndpoint.objects.get().secret == endpoint.secret

    done = operator.post(f"/webhooks/{endpoint.id}/rotate/", {"confirm": "on"})
    assert done.status_code == 302
    assert WebhookEndpoint.objects.get().secret != endpoint.secret
    change = WebhookChange.objects.get(action="rotate")
    assert (change.actor, change.endpoint_id) == ("olga", endpoint.id)


def test_audit_lists_webhook_changes(operator, viewer):
    operator.post(
        "/webhooks/", {"name": "pager", "url": "https://p.example/", "events": ["run.ended"]}
    )
    endpoint = WebhookEndpoint.objects.get()
    operator.post(f"/webhooks/{endpoint.id}/disable/")
    operator.post(f"/webhooks/{endpoint.id}/enable/")
    operator.post(f"/webhooks/{endpoint.id}/rotate/", {"confirm": "on"})
    operator.post(f"/webhooks/{endpoint.id}/delete/", {"confirm": "on"})
    entries = viewer.get(reverse("console:audit"), {"decision": "webhook"}).context["entries"]
    assert [(e.actor, e.decision, e.what) for e in entries] == [
        ("olga", "webhook", "webhook pager: endpoint deleted with 0 pending deliveries"),
        ("olga", "webhook", "webhook pager: secret rotated"),
        ("olga", "webhook", "webhook pager: endpoint enabled"),
        ("olga", "webhook", "webhook pager: endpoint disabled"),
        ("olga", "webhook", "webhook pager: endpoint created"),
    ]
    page = viewer.get(reverse("console:audit")).content.decode()
    assert "secret rotated" in page and f"/webhooks/{endpoint.id}/" in page


def test_audit_lists_pauses_and_resumes_and_filters_them(viewer, new_run):
    run = new_run()
    operations.pause(run.run_id, actor="olga", reason="look first")
    operations.resume_run(run.run_id, actor="rita", reason="fine")
    operations.cancel(new_run().run_id, actor="carl")
    everything = viewer.get(reverse("console:audit")).context["entries"]
    assert [(e.actor, e.decision, e.note) for e in everything] == [
        ("carl", "cancel", ""),
        ("rita", "resume", "fine"),
        ("olga", "pause", "look first"),
    ]
    paused = viewer.get(reverse("console:audit"), {"decision": "pause"}).context["entries"]
    assert [(e.actor, e.decision, e.run_id) for e in paused] == [("olga", "pause", run.run_id)]
    resumed = viewer.get(reverse("console:audit"), {"decision": "resume", "agent": "demo"})
    assert [(e.actor, e.decision) for e in resumed.context["entries"]] == [("rita", "resume")]
    by_olga = viewer.get(reverse("console:audit"), {"actor": "olga"}).context["entries"]
    assert [e.decision for e in by_olga] == ["pause"]


def test_an_unknown_decision_is_refused_never_another_kind(viewer, new_run):
    operations.cancel(new_run().run_id, actor="carl")
    refused = viewer.get(reverse("console:audit"), {"decision": "teleport"})
    assert refused.status_code == 400 and refused.context["entries"] == []
    assert "teleport" in refused.content.decode()
