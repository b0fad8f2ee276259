"""Contract gaps found by the adversarial pass (issue 12, item 9)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection
from django.test import Client

from console.api.api import api as ninja_api
from runtime import operations
from runtime.errors import RuntimeFault
from runtime.models import ReconciliationRecord, Run, ThreadCommit
from tests.api.conftest import BASE, error_of

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_any_method_on_an_unknown_api_path_is_a_json_404(api, method) -> None:
    client = Client(enforce_csrf_checks=True)
    for path in ("/nope", "/runs/x/nope", "/"):
        response = getattr(client, method)(
            BASE + path, "{}", content_type="application/json", headers=api.headers()
        )
        assert response.status_code in (404, 405), (path, response.status_code)
        assert response["Content-Type"].startswith("application/json")
        assert error_of(response)["code"] in ("not_found", "method_not_allowed")


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_on_one_thread_answer_run_active() -> None:
    thread_id = operations.create_thread()
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def start(barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            operations.start_run(agent="demo", input="go", thread_id=thread_id)
            code = "started"
        except RuntimeFault as fault:
            code = fault.code
        finally:
            connection.close()
        with lock:
            outcomes[code] += 1

    for _ in range(5):
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=start, args=(barrier,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        active = Run.objects.filter(thread_id=thread_id).exclude(state="ended").first()
        assert active is not None
        operations.cancel(active.id)
    assert set(outcomes) == {"started", "run_active"}, outcomes
    assert outcomes["started"] == 5


def test_applied_needs_evidence_in_the_api_too(api, awaiting) -> None:
    run = awaiting("approval")
    operations.cancel(run["id"])  # seals the approval call Indeterminate
    call_id = run["ticket"]["call_id"]
    before = (ThreadCommit.objects.count(), ReconciliationRecord.objects.count())
    for evidence in ("", "   "):
        response = api.post(
            f"/tool-calls/{call_id}/reconciliation", {"outcome": "applied", "evidence": evidence}
        )
        assert response.status_code == 422, response.content
        assert "evidence" in error_of(response)["message"]
    assert (ThreadCommit.objects.count(), ReconciliationRecord.objects.count()) == before
    with pytest.raises(RuntimeFault, match="evidence"):
        operations.reconcile(call_id, outcome="applied", evidence="")


def test_the_event_stream_is_typed_as_an_event_stream() -> None:
    schema = ninja_api.get_openapi_schema()
    answer = schema["paths"][f"{BASE}/runs/{{run_id}}/events"]["get"]["responses"]["200"]
    assert list(answer["content"]) == ["text/event-stream"]
    content = answer["content"]["text/event-stream"]
    assert content["schema"]["contentMediaType"] == "text/event-stream"
    item = content["itemSchema"]["properties"]
    assert item["event"]["enum"] == ["commit", "delta", "end"]
    assert item["data"]["contentMediaType"] == "application/json"
