"""``/api/v1/webhooks``: endpoints managed by operators, read by viewers, a test event, the
delivery log, and the one error shape for refusals (nothing written)."""

from __future__ import annotations

import json

import pytest

from runtime import webhooks
from runtime.models import WebhookChange, WebhookEndpoint
from tests.api.conftest import BASE, error_of

pytestmark = pytest.mark.django_db


def patch(api, path: str, body: dict):
    return api.client.patch(
        BASE + path, json.dumps(body), content_type="application/json", headers=api.headers()
    )


def test_an_operator_creates_tests_and_reads_the_log_of_an_endpoint(api):
    created = api.post("/webhooks", {"url": "https://hooks.example/in", "events": ["run.ended"]})
    assert created.status_code == 201, created.content
    endpoint = created.json()
    assert endpoint["secret"].startswith("whsec_") and endpoint["created_by"] == "olivia"
    listed = api.get("/webhooks").json()["items"]
    assert [e["id"] for e in listed] == [endpoint["id"]] and listed[0]["secret"] is None
    assert api.get(f"/webhooks/{endpoint['id']}").json()["secret"] == endpoint["secret"]

    queued = api.post(f"/webhooks/{endpoint['id']}/test")
    assert queued.status_code == 202 and queued.json()["kind"] == "webhook.test"
    (due,) = webhooks.claim_due("w", 5)
    webhooks.record(due, webhooks.Answer(503, "busy", queued_at(), 0.2), worker_id="w")
    log = api.get(f"/webhooks/{endpoint['id']}/deliveries").json()["items"]
    assert log[0]["state"] == "pending" and log[0]["attempts"] == 1
    assert log[0]["log"][0] | {"started_at": None} == {
        "number": 1,
        "worker": "w",
        "started_at": None,
        "duration_ms": 200,
        "status_code": 503,
        "error": "busy",
        "outcome": "retry",
    }

    changed = patch(api, f"/webhooks/{endpoint['id']}", {"enabled": False, "rotate_secret": True})
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert changed.json()["secret"] != endpoint["secret"]
    gone = api.client.delete(f"{BASE}/webhooks/{endpoint['id']}", headers=api.headers())
    assert gone.status_code == 204 and not WebhookEndpoint.objects.exists()
    changes = WebhookChange.objects.order_by("id").values_list("action", "actor", "detail")
    assert list(changes) == [  # for the console's Audit page (issue 32)
        ("create", "olivia", {"events": ["run.ended"]}),
        ("disable", "olivia", {}),
        ("rotate", "olivia", {}),
        ("delete", "olivia", {"pending": 1}),
    ]


def queued_at():
    from django.utils import timezone

    return timezone.now()


def test_a_viewer_reads_but_neither_manages_nor_sees_secrets(api, api_as):
    endpoint = api.post("/webhooks", {"url": "http://h.example/", "events": ["run.ended"]}).json()
    viewer = api_as("vera", "read")
    assert viewer.get(f"/webhooks/{endpoint['id']}").json()["secret"] is None
    refused = viewer.post("/webhooks", {"url": "http://h.example/", "events": ["run.ended"]})
    assert refused.status_code == 403
    assert viewer.post(f"/webhooks/{endpoint['id']}/test").status_code == 403


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"url": "ftp://h.example/", "events": ["run.ended"]}, 422, "webhook_refused"),
        ({"url": "http://h.example/", "events": []}, 422, "validation_error"),
        ({"url": "http://h.example/", "events": ["run.started"]}, 422, "validation_error"),
        (
            {"url": "http://h.example/", "events": ["run.ended"], "secret": "whsec_x"},
            422,
            "webhook_refused",
        ),
    ],
)
def test_a_refused_endpoint_writes_nothing(api, body, status, code):
    response = api.post("/webhooks", body)
    assert response.status_code == status
    assert error_of(response)["code"] == code
    assert not WebhookEndpoint.objects.exists()


def test_an_unknown_endpoint_is_404(api):
    assert error_of(api.get("/webhooks/abc123/deliveries"))["code"] == "not_found"


def test_the_schema_documents_webhooks(api):
    schema = api.client.get(f"{BASE}/openapi.json").json()
    assert {"/api/v1/webhooks", "/api/v1/webhooks/{endpoint_id}/test"} <= set(schema["paths"])
    events = schema["components"]["schemas"]["EndpointIn"]["properties"]["events"]
    assert "run.paused" in json.dumps(events)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/\r\nX-Injected: 1",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost/",
        "http://[::1]/",
        "http://0x7f000001/",
        "http://10.0.0.1/",
        "http://u:pw@h.example/",
    ],
)
def test_a_url_no_request_should_go_to_is_refused(api, url):
    response = api.post("/webhooks", {"url": url, "events": ["run.ended"]})
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] == "webhook_refused"
    assert not WebhookEndpoint.objects.exists()


def test_a_viewer_sees_no_response_body_but_an_operator_does(api, api_as):
    endpoint = api.post("/webhooks", {"url": "http://h.example/", "events": ["run.ended"]}).json()
    api.post(f"/webhooks/{endpoint['id']}/test")
    (due,) = webhooks.claim_due("w", 5)
    webhooks.record(due, webhooks.Answer(500, "internal secret", queued_at(), 0.1), worker_id="w")
    path = f"/webhooks/{endpoint['id']}/deliveries"
    (seen,) = api_as("vera", "read").get(path).json()["items"]
    assert "internal secret" not in json.dumps(seen)
    assert seen["last_error"] == webhooks.BODY_HIDDEN and seen["last_status"] == 500
    (full,) = api.get(path).json()["items"]
    assert full["last_error"] == "internal secret" == full["log"][0]["error"]
