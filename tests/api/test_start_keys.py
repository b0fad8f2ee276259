"""``POST /runs``, ``POST /threads/{id}/runs`` and ``POST /runs/{id}/fork`` with an
``Idempotency-Key`` (issue 31, item 1): the run and its key commit together, so a repeat, also
after an answer lost past the commit, gets the run that was started and starts nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime import retention
from runtime.models import Run, StartRecord, Thread, ThreadCommit
from tests.api.conftest import drive, error_of
from tests.faults import connection_lost_after_commit

pytestmark = pytest.mark.django_db(transaction=True)  # forks drive their source first

NEW_RUN = "runtime_run"  # a start or a fork inserts its run
BODY = {"agent": "demo", "input": "hello", "metadata": {"k": 1}}
SCRIPT = [
    {"tool_calls": [{"name": "ledger_once", "arguments": {"key": "a"}}]},
    {"text": "done"},
]


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def test_a_start_repeated_with_its_key_gets_the_same_run(api):
    first = api.post("/runs", BODY, headers=keyed("start-1"))
    assert first.status_code == 201, first.content
    again = api.post("/runs", BODY, headers=keyed("start-1"))
    assert again.status_code == 201, again.content
    assert again.json() == first.json()
    assert Run.objects.count() == Thread.objects.count() == ThreadCommit.objects.count() == 1
    record = StartRecord.objects.get()
    assert (record.actor, record.key, record.run_id) == ("olivia", "start-1", first.json()["id"])
    other = api.post("/runs", BODY, headers=keyed("start-2"))  # another key: another run
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert Run.objects.count() == 2


def test_a_start_key_is_scoped_to_its_user(api, api_as):
    first = api.post("/runs", BODY, headers=keyed("mine"))
    otto = api_as("otto", "read", "operate").post("/runs", BODY, headers=keyed("mine"))
    assert first.status_code == otto.status_code == 201
    assert otto.json()["id"] != first.json()["id"] and otto.json()["created_by"] == "otto"


@pytest.mark.parametrize(
    "other",
    [
        {**BODY, "input": "goodbye"},
        {**BODY, "metadata": {"k": 2}},
        {**BODY, "input": [{"role": "user", "content": "hello"}]},
    ],
)
def test_a_start_key_sent_with_another_body_is_422(api, other):
    first = api.post("/runs", BODY, headers=keyed("start-1"))
    assert first.status_code == 201
    reused = api.post("/runs", other, headers=keyed("start-1"))
    assert reused.status_code == 422, reused.content
    assert error_of(reused)["code"] == "idempotency_key_reused"
    assert Run.objects.count() == StartRecord.objects.count() == 1


def test_a_refused_start_records_no_key(api):
    refused = api.post("/runs", {**BODY, "agent": "nobody"}, headers=keyed("k"))
    assert refused.status_code == 404 and not StartRecord.objects.exists()
    started = api.post("/runs", BODY, headers=keyed("k"))
    assert started.status_code == 201 and Run.objects.count() == 1


def test_a_thread_start_repeated_with_its_key_gets_the_same_run(api):
    thread = api.post("/threads", {"metadata": {}}).json()["id"]
    path = f"/threads/{thread}/runs"
    first = api.post(path, BODY, headers=keyed("t-1"))
    assert first.status_code == 201, first.content
    api.post(f"/runs/{first.json()['id']}/cancel", {"reason": "done"})
    again = api.post(path, BODY, headers=keyed("t-1"))  # not a second run on the thread
    assert again.status_code == 201, again.content
    assert again.json()["id"] == first.json()["id"] and again.json()["end_cause"] == "cancelled"
    assert Run.objects.filter(thread_id=thread).count() == 1
    elsewhere = api.post("/runs", BODY, headers=keyed("t-1"))  # the same key, another body
    assert elsewhere.status_code == 422 and error_of(elsewhere)["code"] == "idempotency_key_reused"


def test_a_start_whose_connection_was_lost_after_its_commit_is_answered_from_the_log(api):
    """The server asks the log again on a new connection: the start committed, so it is 201
    (never a 503 the client would take for "not started"), and a retry gets the same run."""
    with connection_lost_after_commit(NEW_RUN) as struck:
        lost = api.post("/runs", BODY, headers=keyed("lost-1"))
    assert struck and lost.status_code == 201, lost.content
    (committed,) = Run.objects.values_list("id", flat=True)
    assert lost.json()["id"] == committed
    retry = api.post("/runs", BODY, headers=keyed("lost-1"))
    assert retry.status_code == 201, retry.content
    assert retry.json()["id"] == committed and retry.json()["version"] == 1
    assert Run.objects.count() == ThreadCommit.objects.count() == 1


# -- fork -------------------------------------------------------------------------------------


@pytest.fixture
def source(start) -> str:
    run = start(*SCRIPT)
    drive()
    return run["id"]


def test_a_fork_repeated_with_its_key_gets_the_same_fork(api, source):
    path = f"/runs/{source}/fork"
    first = api.post(path, {"at_step": 1, "input": "again"}, headers=keyed("fork-1"))
    assert first.status_code == 201, first.content
    commits = ThreadCommit.objects.count()
    again = api.post(path, {"at_step": 1, "input": "again"}, headers=keyed("fork-1"))
    assert again.status_code == 201, again.content
    assert again.json() == first.json()
    assert Run.objects.count() == 2 and ThreadCommit.objects.count() == commits
    assert StartRecord.objects.get().run_id == first.json()["id"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("fork", {"at_step": 2, "input": "again"}),
        ("fork", {"at_step": 1}),
        ("fork", {"at_step": 1, "input": "other"}),
        ("start", BODY),  # one scope for starts and forks
    ],
)
def test_a_fork_key_sent_with_another_body_is_422(api, source, path, body):
    first = api.post(f"/runs/{source}/fork", {"at_step": 1, "input": "again"}, headers=keyed("f"))
    assert first.status_code == 201
    runs = Run.objects.count()
    reused = api.post(f"/runs/{source}/fork" if path == "fork" else "/runs", body, keyed("f"))
    assert reused.status_code == 422, reused.content
    assert error_of(reused)["code"] == "idempotency_key_reused"
    assert Run.objects.count() == runs


def test_a_fork_whose_connection_was_lost_after_its_commit_is_answered_from_the_log(api, source):
    path = f"/runs/{source}/fork"
    with connection_lost_after_commit(NEW_RUN) as struck:
        lost = api.post(path, {"at_step": 1}, headers=keyed("lost-fork"))
    assert struck and lost.status_code == 201, lost.content
    (fork,) = Run.objects.exclude(id=source).values_list("id", flat=True)
    assert lost.json()["id"] == fork
    retry = api.post(path, {"at_step": 1}, headers=keyed("lost-fork"))
    assert retry.status_code == 201 and retry.json()["id"] == fork
    assert Run.objects.count() == 2


def test_prune_deletes_a_start_key_with_its_run(api, source):
    fork = api.post(f"/runs/{source}/fork", {"at_step": 2}, headers=keyed("f-prune")).json()
    api.post(f"/runs/{fork['id']}/cancel", {"reason": "done"})
    assert StartRecord.objects.filter(run_id=fork["id"]).exists()
    report = retention.prune(timezone.now() + timedelta(days=1))
    assert report.pruned["runs"] == 2 and not Run.objects.exists()
    assert not StartRecord.objects.exists()
