"""``manage.py runtime_webhook``: add, list, show, disable, test, deliveries, remove."""

from __future__ import annotations

import getpass
import io
import json

import pytest
from django.core.management import CommandError, call_command

from runtime import webhooks
from runtime.models import WebhookChange, WebhookEndpoint

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("runtime_webhook", *args, stdout=out)
    return out.getvalue()


def test_an_endpoint_from_add_to_remove():
    added = json.loads(
        run(
            "add",
            "--url",
            "http://h.example/in",
            "--event",
            "run.ended",
            "--event",
            "ticket.opened",
            "--json",
        )
    )
    endpoint_id = added["id"]
    assert added["events"] == ["run.ended", "ticket.opened"] and added["secret"].startswith(
        "whsec_"
    )
    assert endpoint_id in run("list")
    assert json.loads(run("show", endpoint_id, "--json"))["secret"] == added["secret"]
    assert "disabled" in run("disable", endpoint_id)
    assert not WebhookEndpoint.objects.get(id=endpoint_id).enabled
    assert "queued" in run("test", endpoint_id)
    (due,) = webhooks.claim_due("w", 5)
    webhooks.record(due, webhooks.Answer(200, "", due_time(), 0.01), worker_id="w")
    (log,) = json.loads(run("deliveries", endpoint_id, "--json"))
    assert log["state"] == "delivered" and log["log"][0]["status_code"] == 200
    assert "removed" in run("remove", endpoint_id)
    assert not WebhookEndpoint.objects.exists()
    changes = WebhookChange.objects.order_by("id").values_list("action", "actor")
    assert [a for a, _ in changes] == ["create", "disable", "delete"]  # for Audit (issue 32)
    assert {who for _, who in changes} == {f"cli:{getpass.getuser()}"}


def due_time():
    from django.utils import timezone

    return timezone.now()


def test_a_refusal_is_one_line_and_writes_nothing():
    with pytest.raises(CommandError, match="webhook_refused"):
        run("add", "--url", "file:///etc/passwd", "--event", "run.ended")
    with pytest.raises(CommandError, match="not_found"):
        run("test", "nosuchendpoint")
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize(
    "url", ["http://example.com/\r\nX-Injected: 1", "http://169.254.169.254/", "http://[::1]/"]
)
def test_a_url_no_request_should_go_to_is_refused(url):
    with pytest.raises(CommandError, match="webhook_refused"):
        run("add", "--url", url, "--event", "run.ended")
    assert not WebhookEndpoint.objects.exists()
