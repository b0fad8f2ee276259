"""The Webhooks pages: operators create an endpoint (its secret shown), send a test and read
the delivery log; viewers read without the secret or the buttons."""

from __future__ import annotations

import pytest
from django.utils import timezone

from runtime import webhooks
from runtime.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def test_an_operator_creates_an_endpoint_sends_a_test_and_reads_its_log(operator):
    page = operator.post(
        "/webhooks/",
        {"name": "pager", "url": "https://pager.example/hook", "events": ["ticket.opened"]},
    )
    assert page.status_code == 201
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret in page.content.decode() and endpoint.created_by
    sent = operator.post(f"/webhooks/{endpoint.id}/test/")
    assert sent.status_code == 302
    (due,) = webhooks.claim_due("w1", 5)
    webhooks.record(due, webhooks.Answer(502, "bad gateway", timezone.now(), 0.3), worker_id="w1")
    detail = operator.get(f"/webhooks/{endpoint.id}/").content.decode()
    assert "webhook.test" in detail and "HTTP 502" in detail and "bad gateway" in detail
    assert "Send test" in detail and endpoint.secret in detail
    operator.post(f"/webhooks/{endpoint.id}/disable/")
    assert not WebhookEndpoint.objects.get().enabled
    operator.post(f"/webhooks/{endpoint.id}/delete/", {"confirm": "on"})
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()


def test_a_refused_form_writes_nothing(operator):
    page = operator.post("/webhooks/", {"url": "not a url", "events": ["run.ended"]})
    assert page.status_code == 400 and not WebhookEndpoint.objects.exists()


def test_a_viewer_reads_without_secret_or_buttons(viewer):
    endpoint = webhooks.create_endpoint(url="https://h.example/", events=["run.ended"])
    detail = viewer.get(f"/webhooks/{endpoint.id}/").content.decode()
    assert endpoint.url in detail and endpoint.secret not in detail and "Send test" not in detail
    assert viewer.post(f"/webhooks/{endpoint.id}/test/").status_code == 403
    assert (
        viewer.post(
            "/webhooks/", {"url": "https://x.example/", "events": ["run.ended"]}
        ).status_code
        == 403
    )
    assert not WebhookDelivery.objects.exists()


def test_a_viewer_sees_no_response_body(viewer, operator):
    endpoint = webhooks.create_endpoint(url="https://h.example/", events=["run.ended"])
    webhooks.send_test(endpoint.id)
    (due,) = webhooks.claim_due("w1", 5)
    answer = webhooks.Answer(500, "metadata-token-123", timezone.now(), 0.1)
    webhooks.record(due, answer, worker_id="w1")
    seen = viewer.get(f"/webhooks/{endpoint.id}/").content.decode()
    assert "HTTP 500" in seen and "metadata-token-123" not in seen
    assert "metadata-token-123" in operator.get(f"/webhooks/{endpoint.id}/").content.decode()


def test_a_form_with_an_internal_url_is_refused(operator):
    for url in ("http://169.254.169.254/", "http://10.0.0.1/x", "http://user:pw@h.example/"):
        page = operator.post("/webhooks/", {"url": url, "events": ["run.ended"]})
        assert page.status_code == 400 and not WebhookEndpoint.objects.exists()
