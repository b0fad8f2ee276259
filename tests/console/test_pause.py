"""The console's pause: the run page's pause and resume forms, the paused line, the runs
list's filter, chip and badge, bulk pause and resume by filter, and ``runtime_pause``."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from runtime import operations
from runtime.models import Run, ThreadCommit

pytestmark = pytest.mark.django_db


def _post(client, url, data):
    return client.post(url, data, HTTP_HX_REQUEST="false")


def test_pause_and_resume_from_the_run_page(operator, approval_run):
    run, _ticket = approval_run
    page = operator.get(f"/runs/{run.run_id}/").content.decode()
    assert "Pause this run" in page
    response = _post(operator, f"/runs/{run.run_id}/pause/", {"reason": "look first"})
    assert response.status_code == 302
    row = Run.objects.get(id=run.run_id)
    assert row.paused
    assert ThreadCommit.objects.filter(run_id=run.run_id).last().actor == "olga"
    page = operator.get(f"/runs/{run.run_id}/").content.decode()
    assert 'data-testid="run-paused"' in page and "paused by olga at " in page
    assert ": look first" in page and "Resume this run" in page
    listing = operator.get("/?paused=on").content.decode()
    assert run.run_id[:8] in listing and 'data-testid="paused-badge"' in listing

    refused = _post(operator, f"/runs/{run.run_id}/pause/", {"reason": "again"})
    assert refused.status_code == 409
    assert "already_paused" in refused.content.decode()
    response = _post(operator, f"/runs/{run.run_id}/resume-paused/", {"reason": "ok"})
    assert response.status_code == 302
    assert not Run.objects.get(id=run.run_id).paused


def test_pause_needs_an_operator(approver, approval_run):
    run, _ticket = approval_run
    response = _post(approver, f"/runs/{run.run_id}/pause/", {})
    assert response.status_code == 403
    assert not Run.objects.get(id=run.run_id).paused


def test_bulk_pause_and_resume_by_filter(operator, approval_run, new_run):
    run, _ticket = approval_run
    other = new_run()
    ended = new_run()
    operations.cancel(ended.run_id)
    asked = _post(operator, "/runs/pause/", {"agent": "demo", "action": "pause"})
    assert asked.status_code == 200 and "Pause 2 runs" in asked.content.decode()
    assert not Run.objects.filter(paused=True).exists()  # asking writes nothing
    done = _post(
        operator,
        "/runs/pause/",
        {"agent": "demo", "action": "pause", "confirm": "yes", "expected": "2", "reason": "r"},
    )
    assert done.status_code == 302
    assert set(Run.objects.filter(paused=True).values_list("id", flat=True)) == {
        run.run_id,
        other.run_id,
    }
    asked = _post(operator, "/runs/pause/", {"agent": "demo", "action": "resume"})
    assert "Resume 2 paused runs" in asked.content.decode()
    done = _post(
        operator,
        "/runs/pause/",
        {"agent": "demo", "action": "resume", "confirm": "yes", "expected": "2"},
    )
    assert done.status_code == 302 and not Run.objects.filter(paused=True).exists()


def test_runtime_pause_command(approval_run):
    run, _ticket = approval_run
    out = io.StringIO()
    call_command("runtime_pause", run.run_id, "--reason", "hold", stdout=out)
    assert out.getvalue().startswith(f"run {run.run_id}: awaiting, paused by cli:")
    assert out.getvalue().strip().endswith(": hold")
    shown = io.StringIO()
    call_command("runtime_show", run.run_id, stdout=shown)
    assert "paused by cli:" in shown.getvalue()
    with pytest.raises(CommandError, match="already_paused"):
        call_command("runtime_pause", run.run_id, "--reason", "other", stdout=io.StringIO())
    out = io.StringIO()
    call_command("runtime_pause", run.run_id, "--resume", stdout=out)
    assert out.getvalue().strip() == f"run {run.run_id}: awaiting, not paused"
    again = io.StringIO()  # the same resume again: answered as committed, nothing written
    call_command("runtime_pause", run.run_id, "--resume", stdout=again)
    assert again.getvalue() == out.getvalue()
    with pytest.raises(CommandError, match="not_paused"):
        call_command("runtime_pause", run.run_id, "--resume", "--reason", "other")


@pytest.mark.parametrize("reason", ["a\x00b", "x" * 501])
def test_an_invalid_reason_is_refused_and_nothing_written(operator, approval_run, reason):
    """A reason with NUL or over 500 characters: the single pause answers 400 with the form's
    error and pauses nothing; the bulk pause refuses it before touching a run."""
    run, _ticket = approval_run
    commits = ThreadCommit.objects.filter(run_id=run.run_id).count()
    refused = _post(operator, f"/runs/{run.run_id}/pause/", {"reason": reason})
    assert refused.status_code == 400
    assert 'data-testid="pause-error"' in refused.content.decode()
    bulk = _post(
        operator,
        "/runs/pause/",
        {"agent": "demo", "action": "pause", "confirm": "yes", "expected": "1", "reason": reason},
    )
    assert bulk.status_code == 400
    assert 'data-testid="bulk-pause-error"' in bulk.content.decode()
    assert not Run.objects.get(id=run.run_id).paused
    assert ThreadCommit.objects.filter(run_id=run.run_id).count() == commits


def test_the_paused_time_is_shown_like_the_pages_other_times(operator, approval_run):
    run, _ticket = approval_run
    _post(operator, f"/runs/{run.run_id}/pause/", {"reason": "look"})
    page = operator.get(f"/runs/{run.run_id}/").content.decode()
    line = page.split('data-testid="paused-line"', 1)[1].split("</span>", 1)[0]
    assert "<time datetime=" in line and " UTC</time>" in line, line
    assert "paused by <b>olga</b> at" in line and ": look" in line


def test_runtime_resume_of_a_paused_run_says_it_stays_paused(approval_run):
    """An approval answered while paused is committed and waits for the resume: the
    command's line says so, not only the run's state."""
    run, ticket = approval_run
    call_command("runtime_pause", run.run_id, "--reason", "hold", stdout=io.StringIO())
    out = io.StringIO()
    call_command("runtime_resume", run.run_id, "--ticket", ticket, "--approve", stdout=out)
    assert out.getvalue().startswith(f"run {run.run_id}: running, paused by cli:"), out.getvalue()
    assert ": hold (version " in out.getvalue()


def test_an_inbox_card_of_a_paused_run_says_paused(operator, approval_run, new_run):
    """Issue 32: a paused run's card looked like any other, and a bulk approve answered it
    while its call stays awaiting until a resume. Its card (inbox and ticket page) carries a
    visible "Paused" badge linking the run, and its accessible name says so; other cards
    carry none."""
    run, ticket = approval_run
    other = new_run()
    (call,) = other.open_batch(
        {"name": "ledger_approval", "arguments": {"key": "b"}, "permission": "ask"}
    )
    other_ticket = other.await_ticket(call, "approval", request={"tool": "ledger_approval"})
    inbox = operator.get("/inbox/").content.decode()
    assert 'data-testid="card-paused"' not in inbox
    _post(operator, f"/runs/{run.run_id}/pause/", {"reason": "look"})
    for path in ("/inbox/", f"/tickets/{ticket}/"):
        page = operator.get(path).content.decode()
        card = page.split(f'id="ticket-{ticket}"', 1)[1].split("</header>", 1)[0]
        assert 'data-testid="card-paused"' in card and ">Paused</a>" in card, path
        assert ", paused;" in card or ', paused"' in card, path
    page = operator.get("/inbox/").content.decode()
    card = page.split(f'id="ticket-{other_ticket}"', 1)[1].split("</header>", 1)[0]
    assert 'data-testid="card-paused"' not in card
