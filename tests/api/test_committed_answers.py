"""A committed command is never answered as a failure (issue 21, item 2).

When the read of the run after a command's commit fails (here: the run document's read of
the late-evidence table; on PostgreSQL a real lock held past the lock timeout), the answer is
202 with the commit's seq, not a 500. The same command sent again, without an idempotency key,
by the same user gets the run (200, the first success's shape) and writes nothing; another
command on the consumed ticket, or the same one from someone else, is still 409.
"""

from __future__ import annotations

import pytest

from runtime.models import ThreadCommit
from tests.api.conftest import commit_count, error_of
from tests.faults import failing_reads_of

pytestmark = pytest.mark.django_db(transaction=True)

READ_AFTER = "runtime_lateevidence"  # read by the run document, never by a command's commit


def committed_answer(response, run_id: str) -> int:
    """The commit's seq that a 202 answer names, checked against the log."""
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["committed"] is True and body["run_id"] == run_id and body["message"]
    assert ThreadCommit.objects.filter(run_id=run_id, seq=body["seq"]).exists()
    return body["seq"]


def test_an_approval_whose_run_cannot_be_read_says_it_was_committed(api, api_as, awaiting):
    run = awaiting("approval")
    path = f"/runs/{run['id']}/resume"
    body = {"ticket_id": run["ticket"]["id"], "kind": "approval", "decision": "approve"}
    with failing_reads_of(READ_AFTER):
        seq = committed_answer(api.post(path, body), run["id"])
    written = commit_count(run["id"])

    again = api.post(path, body)  # no Idempotency-Key: the same command gets the run
    assert again.status_code == 200, again.content
    document = again.json()
    assert (document["id"], document["version"], document["ticket"]) == (run["id"], seq, None)
    assert commit_count(run["id"]) == written

    deny = api.post(path, {**body, "decision": "deny"})
    assert deny.status_code == 409 and error_of(deny)["code"] == "ticket_consumed"
    other = api_as("otto", "read", "resume").post(path, body)
    assert other.status_code == 409 and error_of(other)["code"] == "ticket_consumed"
    keyed = api.post(path, body, headers={"Idempotency-Key": "after-all"})
    assert keyed.status_code == 200 and keyed.json()["id"] == run["id"]
    assert commit_count(run["id"]) == written


def test_a_cancel_whose_run_cannot_be_read_says_it_was_committed(api, awaiting):
    run = awaiting("approval")
    path = f"/runs/{run['id']}/cancel"
    with failing_reads_of(READ_AFTER):
        seq = committed_answer(api.post(path, {"reason": "stop"}), run["id"])
    again = api.post(path, {"reason": "stop"})
    assert again.status_code == 200
    assert (again.json()["end_cause"], again.json()["version"]) == ("cancelled", seq)
