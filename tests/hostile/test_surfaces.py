"""The hostile corpus against every input surface a person or a client reaches.

Each value must get a 4xx (or a typed error) and write nothing (row counts of every log and
projection table are compared before and after); what a page echoes back renders inert.
The API, the console's pages and forms run in-process through Django's test client on the
real database (PostgreSQL refuses NUL and lone surrogates, which is what made them 500s).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from runtime.demo.models import LedgerEffect
from runtime.models import (
    CommandRecord,
    MessageRecord,
    ReconciliationRecord,
    Run,
    StartRecord,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
    WebhookEndpoint,
)
from tests.api.conftest import INPUT, drive, error_of
from tests.hostile.corpus import (
    ARGUMENT_TEXTS,
    BAD_PORTS,
    INTERNAL_HOSTS,
    JSON_VALUES,
    NOT_UTF8_JSON,
    NUMBER_TEXTS,
    PATH_SEGMENTS,
    TEXT,
    crafted_cursors,
)

pytestmark = pytest.mark.django_db

TABLES = (
    Thread,
    Run,
    ThreadCommit,
    MessageRecord,
    ToolCallRecord,
    Ticket,
    CommandRecord,
    StartRecord,
    ReconciliationRecord,
    LedgerEffect,
    WebhookEndpoint,
)
# The hostile values as they reach a JSON body or a form field (surrogates cannot survive a
# form's UTF-8 decoding, so a form gets them as JSON escapes in its JSON fields).
BODY_TEXTS = {k: v for k, v in TEXT.items() if k != "html"}
SCRIPT_TEXTS = {
    **{f"arguments_{k}": v for k, v in ARGUMENT_TEXTS.items()},
    "nul": '{"steps": [{"text": "a\\u0000b"}]}',
    "surrogate": '{"steps": [{"text": "a\\ud800b"}]}',
    "deep": "[" * 20_000 + "]" * 20_000,
    "huge_int": '{"steps": [], "n": ' + "9" * 5_000 + "}",
}


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in TABLES}


@pytest.fixture
def unchanged():
    """Yield; then assert that no table gained or lost a row."""
    before = counts()
    yield
    assert counts() == before


@pytest.fixture
def operator_client(make_user) -> Client:
    user, _ = make_user("oscar", superuser=True)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(make_user) -> Client:
    user, _ = make_user("vera", "read")
    client = Client()
    client.force_login(user)
    return client


def assert_inert(html: str) -> None:
    """The HTML payload of the corpus, if echoed, is text: no element of it survives."""
    assert "<script>window.__pwned" not in html and "<img src=x" not in html


def refused(response, *statuses: int) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    if statuses:
        assert response.status_code in statuses, (response.status_code, response.content[:500])


# -- the JSON API ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BODY_TEXTS))
@pytest.mark.parametrize("field", ["agent", "input", "metadata_key", "metadata_value"])
def test_api_start_refuses_hostile_text(api, unchanged, name, field) -> None:
    value = BODY_TEXTS[name] * (10 if name == "huge" else 1)  # huge: over the body limit
    body: dict[str, Any] = {"agent": "demo", "input": "go", "metadata": {}}
    if field == "metadata_key":
        body["metadata"] = {value: 1}
    elif field == "metadata_value":
        body["metadata"] = {"k": value}
    else:
        body[field] = value
    refused(api.post("/runs", body), 404, 413, 422)


@pytest.mark.parametrize("name", sorted(JSON_VALUES))
def test_api_refuses_hostile_json(api, unchanged, name) -> None:
    value = JSON_VALUES[name]
    refused(api.post("/runs", {"agent": "demo", "input": "go", "metadata": value}), 422)
    refused(api.post("/threads", {"metadata": value}), 422)


def test_api_refuses_too_deep_and_huge_number_bodies(api, unchanged) -> None:
    for raw in ("[" * 20_000 + "]" * 20_000, '{"agent": "demo", "input": ' + "9" * 5000 + "}"):
        response = api.client.post(
            "/api/v1/runs", raw, content_type="application/json", headers=api.headers()
        )
        refused(response, 400, 422)


@pytest.mark.parametrize("name", sorted(NOT_UTF8_JSON))
@pytest.mark.parametrize("path", ["/runs", "/threads", "/webhooks"])
def test_api_refuses_json_that_is_not_utf8_without_a_bom(api, unchanged, name, path) -> None:
    """RFC 8259 §8.1: JSON is UTF-8, without a byte order mark; one rule for every body."""
    response = api.client.post(
        f"/api/v1{path}",
        NOT_UTF8_JSON[name],
        content_type="application/json",
        headers=api.headers(),
    )
    refused(response, 400)
    error = error_of(response)
    assert error["code"] == "invalid_encoding"
    assert "UTF-8" in error["message"] and error["detail"]["encoding"]


@pytest.mark.parametrize("name", sorted(INTERNAL_HOSTS))
def test_api_webhook_refuses_internal_hosts_in_any_spelling(api, unchanged, name) -> None:
    url = f"http://{INTERNAL_HOSTS[name]}/in"
    response = api.post("/webhooks", {"url": url, "events": ["run.ended"]})
    refused(response, 422)
    assert error_of(response)["code"] == "webhook_refused"


@pytest.mark.parametrize("port", BAD_PORTS)
def test_api_webhook_refuses_ports_outside_the_range(api, unchanged, port) -> None:
    response = api.post(
        "/webhooks", {"url": f"https://hooks.example:{port}/", "events": ["run.ended"]}
    )
    refused(response, 422)
    error = error_of(response)
    assert error["code"] == "webhook_refused" and "1 to 65535" in error["message"]


@pytest.mark.parametrize("segment", sorted(PATH_SEGMENTS))
def test_api_paths_with_odd_ids(api, unchanged, segment) -> None:
    raw = PATH_SEGMENTS[segment]
    for path in (f"/runs/{raw}", f"/runs/{raw}/commits", f"/runs/{raw}/events", f"/threads/{raw}"):
        refused(api.get(path), 404, 422)
    refused(api.post(f"/runs/{raw}/cancel", {"reason": "x"}), 404, 405, 422)


@pytest.mark.parametrize("name", sorted(crafted_cursors()))
@pytest.mark.parametrize("path", ["/runs", "/tickets", "/tool-calls"])
def test_api_crafted_cursors_are_invalid_cursor(api, unchanged, name, path) -> None:
    response = api.get(path, cursor=crafted_cursors()[name])
    refused(response, 422)
    assert response.json()["error"]["code"] in ("invalid_cursor", "validation_error")
    if len(crafted_cursors()[name]) <= 200:  # the pattern admits it: the decoder refuses it
        assert response.json()["error"]["code"] == "invalid_cursor"


# Query-string values as sent on the wire (percent-encoded bytes; a surrogate's UTF-8 form
# is invalid, and Django decodes it to U+FFFD).
RUN_FILTERS = ("state", "agent", "thread", "limit")
QUERY_VALUES = {
    "nul": "a%00b",
    "surrogate": "a%ED%A0%80b",
    "invalid_utf8": "%FF%FE",
    "html": "%3Cscript%3E",
}


@pytest.mark.parametrize("name", sorted(QUERY_VALUES))
@pytest.mark.parametrize(
    "param", ["state", "agent", "thread", "cursor", "limit", "after", "run", "kind", "phase"]
)
@pytest.mark.parametrize("path", ["/runs", "/tickets", "/tool-calls"])
def test_api_query_strings(api, unchanged, name, param, path) -> None:
    response = api.client.get(f"/api/v1{path}?{param}={QUERY_VALUES[name]}", headers=api.headers())
    assert response.status_code in (200, 422), (response.status_code, response.content[:300])
    if name == "nul" and (param == "cursor" or path == "/runs" and param in RUN_FILTERS):
        assert response.status_code == 422  # a parameter the operation reads


# -- the console ----------------------------------------------------------------------------


@pytest.mark.parametrize("segment", sorted(PATH_SEGMENTS))
def test_console_paths_with_odd_ids(operator_client, unchanged, segment) -> None:
    raw = PATH_SEGMENTS[segment]
    for path in (f"/runs/{raw}/", f"/tickets/{raw}/", f"/reconcile/{raw}/"):
        refused(operator_client.get(path), 404)
    refused(operator_client.post(f"/runs/{raw}/cancel/", {"confirm": "on"}), 404)
    refused(operator_client.post(f"/tickets/{raw}/answer/", {"decision": "approve"}), 404)


@pytest.mark.parametrize("name", sorted(SCRIPT_TEXTS))
def test_console_start_form_refuses_hostile_scripts(operator_client, unchanged, name) -> None:
    data = {"agent": "demo", "input": "go", "script": SCRIPT_TEXTS[name]}
    if name.startswith("arguments_"):
        # A script whose tool-call arguments are hostile text is a valid script: the model's
        # output is refused later, by the run (tests/hostile/test_model_output.py).
        return
    refused(operator_client.post("/runs/new/", data), 400, 422)


@pytest.mark.parametrize("field", ["input", "thread_id", "agent"])
def test_console_start_form_refuses_nul_and_echoes_inert(operator_client, unchanged, field):
    data = {"agent": "demo", "input": "go", "script": ""}
    data[field] = TEXT["nul"] + TEXT["html"]
    response = operator_client.post("/runs/new/", data)
    refused(response, 400, 404, 422)
    assert_inert(response.content.decode())


@pytest.mark.parametrize("name", ["nul", "surrogate", "deep", "huge_int"])
def test_console_input_answer_refuses_hostile_values(operator_client, api, name) -> None:
    body = {"agent": "demo", "input": "go", "metadata": {"script": {"steps": [INPUT]}}}
    run = api.post("/runs", body).json()
    drive()
    ticket = Ticket.objects.get(run_id=run["id"], state="open")
    value = {
        "nul": '"a\\u0000b"',
        "surrogate": '"a\\ud800b"',
        "deep": "[" * 20_000 + "]" * 20_000,
        "huge_int": "9" * 5_000,
    }[name]
    before = counts()
    response = operator_client.post(
        f"/tickets/{ticket.id}/answer/", {"decision": "input", "answer-n": value}
    )
    refused(response, 400, 422)
    assert counts() == before
    ticket.refresh_from_db()
    assert ticket.state == "open"


@pytest.mark.parametrize("name", sorted(QUERY_VALUES))
@pytest.mark.parametrize("param", ["after", "q", "agent", "state", "cause"])
@pytest.mark.parametrize("path", ["/", "/inbox/", "/reconcile/"])
def test_console_query_strings(operator_client, unchanged, name, param, path) -> None:
    value = QUERY_VALUES[name]
    for query in (f"{param}={value}", f"{param}=2026-01-01T00:00:00%2B00:00~{value}"):
        response = operator_client.get(f"{path}?{query}")
        assert response.status_code in (200, 400, 404, 422), response.status_code
        assert_inert(response.content.decode())


def test_api_resume_input_answer(api) -> None:
    """Same values through the API's resume body: 422, the ticket stays open."""
    body = {"agent": "demo", "input": "go", "metadata": {"script": {"steps": [INPUT]}}}
    run = api.post("/runs", body).json()
    drive()
    ticket = Ticket.objects.get(run_id=run["id"], state="open")
    before = counts()
    for value in ({"n": "\x00"}, {"n": "\ud800"}, {"n": JSON_VALUES["deep"]}):
        response = api.post(
            f"/runs/{run['id']}/resume",
            {"ticket_id": ticket.id, "kind": "input", "input": value},
        )
        refused(response, 422)
    raw = json.dumps({"ticket_id": ticket.id, "kind": "input", "input": {"n": 0}})
    raw = raw.replace('"n": 0', '"n": ' + "9" * 5000)
    response = api.client.post(
        f"/api/v1/runs/{run['id']}/resume",
        raw,
        content_type="application/json",
        headers=api.headers(),
    )
    refused(response, 400, 422)
    assert counts() == before


# -- every query parameter, every number (issue 31, item 3) ---------------------------------


def _query_parameters() -> list[tuple[str, str, str]]:
    """(path, parameter, type) of every query parameter of every API operation, from the
    OpenAPI document clients read (path parameters filled with an id nobody has)."""
    from console.api.api import api as ninja_api

    found = []
    for path, operations in ninja_api.get_openapi_schema()["paths"].items():
        for parameter in operations.get("get", {}).get("parameters", []):
            if parameter["in"] == "query":
                kind = parameter.get("schema", {}).get("type", "")
                filled = path.replace("{run_id}", "0" * 32).replace("{endpoint_id}", "0" * 32)
                found.append((filled, parameter["name"], kind))
    return found


QUERY_PARAMETERS = _query_parameters()


def assert_names_parameter(response, name: str) -> None:
    """422 validation_error whose errors name the query parameter ``name``."""
    assert response.status_code == 422, (response.status_code, response.content[:300])
    error = response.json()["error"]
    assert error["code"] == "validation_error", error
    assert ["query", name] in [e["loc"] for e in error["detail"]["errors"]], error


@pytest.mark.parametrize(("path", "param", "kind"), QUERY_PARAMETERS)
def test_api_nul_in_any_query_parameter_is_422_naming_it(api, unchanged, path, param, kind):
    response = api.client.get(f"{path}?{param}=a%00b", headers=api.headers())
    assert_names_parameter(response, param)


@pytest.mark.parametrize("number", sorted(NUMBER_TEXTS))
@pytest.mark.parametrize(
    ("path", "param", "kind"), [p for p in QUERY_PARAMETERS if p[2] == "integer"]
)
def test_api_odd_numbers_in_query_parameters_are_422(api, unchanged, path, param, kind, number):
    response = api.client.get(path, {param: NUMBER_TEXTS[number]}, headers=api.headers())
    assert_names_parameter(response, param)


@pytest.fixture
def run_id(api) -> str:
    """A run with a few commits (it waits for an input)."""
    body = {"agent": "demo", "input": "go", "metadata": {"script": {"steps": [INPUT]}}}
    run = api.post("/runs", body).json()
    drive()
    return run["id"]


@pytest.mark.parametrize("number", sorted(NUMBER_TEXTS))
def test_console_log_page_refuses_odd_numbers(viewer_client, run_id, unchanged, number):
    response = viewer_client.get(f"/runs/{run_id}/", {"log_before": NUMBER_TEXTS[number]})
    assert response.status_code == 400, response.status_code
    assert viewer_client.get(f"/runs/{run_id}/", {"log_before": "2"}).status_code == 200


@pytest.mark.parametrize("number", sorted(NUMBER_TEXTS))
def test_console_fork_refuses_odd_steps(operator_client, run_id, unchanged, number):
    response = operator_client.post(
        f"/runs/{run_id}/fork/", {"at_step": NUMBER_TEXTS[number]}, follow=True
    )
    assert response.status_code == 200
    assert "Not forked: choose the step to fork after." in response.content.decode()
