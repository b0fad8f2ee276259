"""Sign-in and permissions: anonymous visitors go to sign-in, viewers read but every write is
403, approvers answer tickets only, operators do everything."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def urls(approval_run, indeterminate_call):
    run, ticket_id = approval_run
    _, call = indeterminate_call
    return {
        "pages": [
            reverse("console:runs"),
            reverse("console:run", args=[run.run_id]),
            reverse("console:inbox"),
            reverse("console:ticket", args=[ticket_id]),
            reverse("console:reconcile"),
        ],
        "writes": {
            "answer": (reverse("console:answer", args=[ticket_id]), {"decision": "approve"}),
            "cancel": (reverse("console:cancel", args=[run.run_id]), {"confirm": "on"}),
            "reconcile": (
                reverse("console:reconcile_call", args=[call.call_id]),
                {f"{call.call_id}-outcome": "not_applied"},
            ),
            "start": (reverse("console:start"), {"agent": "demo", "input": "hi"}),
        },
    }


def test_anonymous_visitors_are_sent_to_sign_in(urls):
    client = Client()
    for url in [*urls["pages"], reverse("console:start"), reverse("console:tokens")]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url
    for url, data in urls["writes"].values():
        response = client.post(url, data)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_signed_in_without_a_group_gets_403(client_for, urls):
    client = client_for(None)
    for url in urls["pages"]:
        response = client.get(url)
        assert response.status_code == 403, url
        assert b"read_runs permission" in response.content


def test_only_readers_pages_go_live(client_for, viewer, urls):
    """The body's ``data-live`` lets the script open the live WebSocket: never on a page served
    to someone the socket would refuse (the sign-in page, 404 and 403 pages)."""
    live = b" data-live>"
    anonymous, nobody = Client(), client_for(None)
    assert live not in anonymous.get(reverse("console:login")).content
    assert live not in anonymous.get("/no-such-page/").content
    assert live not in nobody.get(urls["pages"][0]).content
    assert live not in nobody.get(reverse("console:tokens")).content
    for url in urls["pages"]:
        assert live in viewer.get(url).content, url


def test_viewer_reads_every_page(viewer, urls):
    for url in urls["pages"]:
        assert viewer.get(url).status_code == 200, url
    assert viewer.get(reverse("console:tokens")).status_code == 200


def test_viewer_gets_403_on_every_write(viewer, urls, approval_run):
    run, ticket_id = approval_run
    assert viewer.get(reverse("console:start")).status_code == 403
    for name, (url, data) in urls["writes"].items():
        assert viewer.post(url, data).status_code == 403, name
        htmx = viewer.post(url, data, headers={"HX-Request": "true"})
        assert htmx.status_code == 403, name
        assert b"<html" not in htmx.content and b"permission" in htmx.content
    # nothing was written
    from runtime.models import Run, Ticket

    assert Ticket.objects.get(id=ticket_id).state == "open"
    assert Run.objects.get(id=run.run_id).state == "awaiting"
    assert Run.objects.count() == 2


def test_viewer_sees_no_write_controls(viewer, approval_run):
    run, _ = approval_run
    page = viewer.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert "Cancel this run" not in page
    assert 'value="approve"' not in page
    assert "answering needs the approvers or operators group" in page


def test_approver_answers_but_cannot_operate(approver, urls):
    writes = urls["writes"]
    for name in ("cancel", "reconcile", "start"):
        url, data = writes[name]
        assert approver.post(url, data).status_code == 403, name
    url, data = writes["answer"]
    assert approver.post(url, data, headers={"HX-Request": "true"}).status_code == 200


def test_writes_refuse_get(operator, urls):
    for name in ("answer", "cancel", "reconcile"):
        url, _ = urls["writes"][name]
        assert operator.get(url).status_code == 405, name


def test_sign_in_and_out(make_user):
    make_user("dora", "viewers")
    client = Client(enforce_csrf_checks=True)
    page = client.get(reverse("console:login"))
    assert page.status_code == 200
    token = page.cookies["csrftoken"].value
    bad = client.post(
        reverse("console:login"),
        {"username": "dora", "password": "wrong", "csrfmiddlewaretoken": token},
    )
    assert bad.status_code == 200 and b"correct username and password" in bad.content
    good = client.post(
        reverse("console:login"),
        {"username": "dora", "password": "pw-dora", "csrfmiddlewaretoken": token},
    )
    assert good.status_code == 302 and good["Location"] == "/"
    assert client.get("/").status_code == 200
    token = client.cookies["csrftoken"].value
    out = client.post(reverse("console:logout"), {"csrfmiddlewaretoken": token})
    assert out.status_code == 302
    assert client.get("/").status_code == 302


def test_every_form_carries_csrf(operator, approval_run, indeterminate_call):
    run, ticket_id = approval_run
    client = operator
    for url in [
        reverse("console:run", args=[run.run_id]),
        reverse("console:inbox"),
        reverse("console:reconcile"),
        reverse("console:start"),
        reverse("console:tokens"),
    ]:
        page = client.get(url).content.decode()
        forms = page.count('method="post"')  # filter forms (GET) carry no token
        assert forms > 0, url
        assert page.count('name="csrfmiddlewaretoken"') == forms, url
        assert 'hx-headers=\'{"X-CSRFToken": "' in page, url


def test_csrf_is_enforced_on_writes(make_user, approval_run):
    run, ticket_id = approval_run
    user = make_user("strict", "operators")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(reverse("console:answer", args=[ticket_id]), {"decision": "approve"})
    assert response.status_code == 403
    page = client.get(reverse("console:inbox"))
    token = page.cookies["csrftoken"].value
    ok = client.post(
        reverse("console:answer", args=[ticket_id]),
        {"decision": "approve"},
        headers={"HX-Request": "true", "X-CSRFToken": token},
    )
    assert ok.status_code == 200


def test_an_expired_session_sends_htmx_requests_to_sign_in(approval_run):
    _, ticket_id = approval_run
    response = Client().post(
        reverse("console:answer", args=[ticket_id]),
        {"decision": "approve"},
        headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/inbox/"},
    )
    assert response.status_code == 401
    assert response["HX-Redirect"] == "/login/?next=%2Finbox%2F"
