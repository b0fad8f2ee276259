"""Tokens and permissions: 401 without a valid token, 403 without the permission, and every
write records who did it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import timeouts
from console.management.groups import ensure_groups
from console.models import ApiToken
from runtime.models import Run
from tests.api.conftest import Api, error_of

pytestmark = pytest.mark.django_db

RUN = "0" * 32
# (method, path, body, permission it needs)
OPERATIONS = [
    ("get", "/runs", None, "read"),
    ("get", f"/runs/{RUN}", None, "read"),
    ("get", f"/runs/{RUN}/commits", None, "read"),
    ("get", f"/runs/{RUN}/events", None, "read"),
    ("get", f"/threads/{RUN}", None, "read"),
    ("get", "/tickets", None, "read"),
    ("get", "/tool-calls", None, "read"),
    (
        "post",
        f"/runs/{RUN}/resume",
        {"ticket_id": RUN, "kind": "approval", "decision": "approve"},
        "resume",
    ),
    ("post", "/runs", {"agent": "demo", "input": "x"}, "operate"),
    ("post", "/threads", {}, "operate"),
    ("post", f"/threads/{RUN}/runs", {"agent": "demo", "input": "x"}, "operate"),
    ("post", f"/runs/{RUN}/cancel", {}, "operate"),
    ("post", f"/tool-calls/{RUN}/reconciliation", {"outcome": "unknown"}, "operate"),
]


def call(api: Api, method: str, path: str, body):
    return api.get(path) if method == "get" else api.post(path, body)


@pytest.mark.parametrize(("method", "path", "body", "perm"), OPERATIONS)
def test_no_token_is_401(method, path, body, perm):
    response = call(Api(Client(), None), method, path, body)
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header",
    ["Bearer rt_not-a-real-token", "Bearer ", "Basic dXNlcjpwdw==", "rt_x", "Bearer " + "x" * 300],
)
def test_an_invalid_token_is_401(header):
    response = Client().get("/api/v1/runs", headers={"Authorization": header})
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthorized"


def test_a_revoked_token_is_401(make_user):
    user, token = make_user("rita", "read")
    assert Api(Client(), token).get("/runs").status_code == 200
    ApiToken.objects.get(user=user).revoke()
    assert Api(Client(), token).get("/runs").status_code == 401


def test_an_inactive_users_token_is_401(make_user):
    _, token = make_user("ivan", "read", active=False)
    assert Api(Client(), token).get("/runs").status_code == 401


def test_a_token_records_when_it_was_last_used(make_user):
    user, token = make_user("lu", "read")
    assert ApiToken.objects.get(user=user).last_used_at is None
    Api(Client(), token).get("/runs")
    assert ApiToken.objects.get(user=user).last_used_at is not None


@pytest.mark.parametrize(("method", "path", "body", "perm"), OPERATIONS)
def test_without_the_permission_is_403(api_as, method, path, body, perm):
    others = [p for p in ("read", "resume", "operate") if p != perm]
    response = call(api_as("nemo", *others), method, path, body)
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "forbidden"
    assert error["detail"]["permission"].endswith(
        {"read": "read_runs", "resume": "resume_runs", "operate": "operate_runs"}[perm]
    )


@pytest.mark.parametrize(("method", "path", "body", "perm"), OPERATIONS)
def test_with_the_permission_passes_the_gate(api_as, method, path, body, perm):
    response = call(api_as("pat", perm), method, path, body)
    assert response.status_code not in (401, 403), response.content


def test_a_superuser_may_do_everything(api_as):
    admin = api_as("root", superuser=True)
    assert admin.post("/runs", {"agent": "demo", "input": "x"}).status_code == 201


def group_member(make_user, group: str) -> Api:
    user, token = make_user(f"in-{group}")
    user.groups.add(ensure_groups()[group])
    return Api(Client(), token)


def test_the_console_groups_grant_the_api_permissions(make_user, awaiting):
    run = awaiting("approval")
    viewer = group_member(make_user, "viewers")
    approver = group_member(make_user, "approvers")
    operator = group_member(make_user, "operators")
    answer = {"ticket_id": run["ticket"]["id"], "kind": "approval", "decision": "approve"}

    assert viewer.get(f"/runs/{run['id']}").status_code == 200
    assert viewer.post(f"/runs/{run['id']}/resume", answer).status_code == 403
    assert approver.post(f"/runs/{run['id']}/cancel", {}).status_code == 403
    assert approver.post("/runs", {"agent": "demo", "input": "x"}).status_code == 403
    assert approver.post(f"/runs/{run['id']}/resume", answer).status_code == 200
    assert operator.post(f"/runs/{run['id']}/cancel", {}).status_code == 200
    assert operator.post("/runs", {"agent": "demo", "input": "x"}).status_code == 201


def test_every_write_records_who_did_it(api_as, awaiting):
    run = awaiting("approval")
    approver = api_as("alice", "read", "resume")
    operator = api_as("bob", "read", "operate")
    answer = {"ticket_id": run["ticket"]["id"], "kind": "approval", "decision": "approve"}
    assert approver.post(f"/runs/{run['id']}/resume", answer).status_code == 200
    assert operator.post(f"/runs/{run['id']}/cancel", {}).status_code == 200
    actors = [c["actor"] for c in operator.get(f"/runs/{run['id']}/commits").json()["items"]]
    assert actors[-2:] == ["alice", "bob"]
    started = operator.post("/runs", {"agent": "demo", "input": "x"}).json()
    assert Run.objects.get(id=started["id"]).created_by == "bob"


class GrantsRead:
    """An authentication backend of a deployment's own (LDAP groups, say): it grants read
    to the user named "ldap-reader" and nothing else."""

    def authenticate(self, request, **credentials):
        return None

    def has_perm(self, user, perm, obj=None):
        return user.get_username() == "ldap-reader" and perm == "console.read_runs"


def test_a_permission_from_another_backend_passes_the_gate(make_user, settings):
    settings.AUTHENTICATION_BACKENDS = [
        "django.contrib.auth.backends.ModelBackend",
        f"{__name__}.GrantsRead",
    ]
    _, reader = make_user("ldap-reader")
    _, other = make_user("ldap-other")
    assert Api(Client(), reader).get("/runs").status_code == 200
    assert Api(Client(), other).get("/runs").status_code == 403


def test_without_model_backend_a_model_grant_does_not_pass(make_user, settings):
    settings.AUTHENTICATION_BACKENDS = [f"{__name__}.GrantsRead"]
    _, token = make_user("granted-by-model-only", "read")
    assert Api(Client(), token).get("/runs").status_code == 403


def test_one_query_authenticates_a_request(make_user):
    """The token, its user and the permission (direct or through a group) in one query, not
    three; the list is the second. On PostgreSQL the request's timeouts are set and reset
    around it (console.timeouts): those two statements are not the request's reads."""
    user, token = make_user("quick")
    user.groups.add(ensure_groups()["viewers"])
    api = Api(Client(), token)
    assert api.get("/runs").status_code == 200  # the first use also stamps last_used_at
    with CaptureQueriesContext(connection) as context:
        assert api.get("/runs").status_code == 200
    bounds = (timeouts.bounds_sql(), timeouts.RESET_SQL)
    reads = [q["sql"] for q in context.captured_queries if q["sql"] not in bounds]
    assert len(reads) == 2, reads
