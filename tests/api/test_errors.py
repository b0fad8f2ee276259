"""One error shape for every 4xx and 5xx, and the served OpenAPI schema and docs."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.api.conftest import error_of

pytestmark = pytest.mark.django_db


def test_an_unknown_path_is_a_json_404(api):
    for path in ("/nope", "/runs/x/y/z", "/", "/runs/"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert error_of(response)["code"] == "not_found"


def test_a_wrong_method_is_a_json_405_with_allow(api):
    response = api.client.delete("/api/v1/runs", headers=api.headers())
    assert response.status_code == 405
    error = error_of(response)
    assert error["code"] == "method_not_allowed"
    assert set(error["detail"]["allowed"]) == {"GET", "POST"}
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_an_unparsable_body_is_a_json_400(api):
    response = api.client.post(
        "/api/v1/runs", "{not json", content_type="application/json", headers=api.headers()
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "bad_request"


def test_validation_errors_list_what_is_wrong(api):
    response = api.post("/runs", {"agent": "demo", "input": 3})
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "validation_error"
    locations = [e["loc"] for e in error["detail"]["errors"]]
    assert locations == [["body", "input"]]  # from the body, not the view's parameter


@pytest.mark.parametrize(
    ("given", "loc", "kind"),
    [
        (3, ["body", "input"], "input_type"),
        ("nul \u0000", ["body", "input", "text"], "unstorable_text"),
        (
            [{"role": "tool", "content": "x"}],
            ["body", "input", "messages", 0, "role"],
            "literal_error",
        ),
    ],
)
def test_an_input_error_names_the_form_that_was_sent(api, given, loc, kind):
    response = api.post("/runs", {"agent": "demo", "input": given})
    assert response.status_code == 422
    assert [(e["loc"], e["type"]) for e in error_of(response)["detail"]["errors"]] == [(loc, kind)]


def test_an_unexpected_error_is_a_json_500(api, monkeypatch, caplog):
    def broken(run_id):
        raise RuntimeError("boom")

    monkeypatch.setattr("console.api.runs.run_out", broken)
    response = api.get("/runs/" + "0" * 32)
    assert response.status_code == 500
    error = error_of(response)
    assert error == {"code": "internal_error", "message": "internal server error", "detail": {}}
    assert "boom" not in response.content.decode()
    assert "unhandled error" in caplog.text


def test_the_openapi_schema_is_served_without_a_token():
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    operations = {
        (method.upper(), path) for path, item in schema["paths"].items() for method in item
    }
    assert operations == {
        ("POST", "/api/v1/threads"),
        ("GET", "/api/v1/threads/{thread_id}"),
        ("POST", "/api/v1/threads/{thread_id}/runs"),
        ("POST", "/api/v1/runs"),
        ("POST", "/api/v1/runs/move"),
        ("GET", "/api/v1/runs"),
        ("GET", "/api/v1/runs/{run_id}"),
        ("GET", "/api/v1/runs/{run_id}/commits"),
        ("POST", "/api/v1/runs/{run_id}/resume"),
        ("POST", "/api/v1/runs/{run_id}/cancel"),
        ("POST", "/api/v1/runs/{run_id}/fork"),
        ("POST", "/api/v1/runs/{run_id}/pause"),
        ("GET", "/api/v1/runs/{run_id}/events"),
        ("GET", "/api/v1/tickets"),
        ("GET", "/api/v1/tool-calls"),
        ("POST", "/api/v1/tool-calls/{call_id}/reconciliation"),
        ("GET", "/api/v1/limits"),
        ("GET", "/api/v1/webhooks"),
        ("POST", "/api/v1/webhooks"),
        ("GET", "/api/v1/webhooks/{endpoint_id}"),
        ("PATCH", "/api/v1/webhooks/{endpoint_id}"),
        ("DELETE", "/api/v1/webhooks/{endpoint_id}"),
        ("GET", "/api/v1/webhooks/{endpoint_id}/deliveries"),
        ("POST", "/api/v1/webhooks/{endpoint_id}/test"),
    }
    assert schema["components"]["securitySchemes"] == {
        "TokenAuth": {"type": "http", "scheme": "bearer"}
    }
    error = schema["components"]["schemas"]["ErrorOut"]
    assert error["properties"]["error"]["$ref"].endswith("/ErrorBody")
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            takes_input = operation.get("parameters") or operation.get("requestBody")
            for status in ("401", "403", "422") if takes_input else ("401", "403"):
                assert status in responses, (method, path, status)
                content = responses[status]["content"]["application/json"]["schema"]
                assert content["$ref"].endswith("/ErrorOut")
    resume = schema["paths"]["/api/v1/runs/{run_id}/resume"]["post"]
    assert {"200", "404", "409", "422"} <= set(resume["responses"])
    assert "ticket_not_answerable" in resume["description"]  # the refusals are documented
    events = schema["paths"]["/api/v1/runs/{run_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]


def test_the_docs_are_browsable():
    response = Client().get("/api/v1/docs")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()


def test_a_request_django_refuses_before_any_view_has_the_error_shape(api):
    """A Host header Django does not serve (an empty one, as a fuzzer sends) is refused before
    the API sees the request: still the API's JSON error, not Django's HTML page."""
    response = api.client.post(
        "/api/v1/threads", "{}", content_type="application/json", headers={"host": ""}
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "bad_request"
