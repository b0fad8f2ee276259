"""The main navigation's live counts: open tickets (Inbox) and unreconciled calls (Reconcile).

Both are counts on partial indexes (``ticket_open_oldest``, ``call_indeterminate_started``),
capped at ``COUNT_CAP`` ("1,000+"): they ride on every page, and tickets left open or calls
left unreconciled pile up with the history; ``tab_count`` serves one count as a fragment that
refreshes when a run commits.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from console.models import READ
from console.views.common import capped, needs
from runtime.inventory import unreconciled_calls
from runtime.models import Ticket

TABS = ("inbox", "reconcile")


def count(which: str) -> int | str:
    """Open tickets the inbox lists (``inbox``: a delegation ticket is answered by its child,
    so it is not listed nor counted) or calls still to reconcile (``reconcile``: what the
    queue's "To check" lists, ``inventory.unreconciled_calls``)."""
    if which == "inbox":
        return capped(Ticket.objects.filter(state="open").exclude(kind="delegation"))
    return capped(unreconciled_calls())


def tab_counts(request: HttpRequest) -> dict[str, Any]:
    """Context processor: ``tab_counts`` for a signed-in reader, else nothing."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.has_perm(READ):
        return {}
    return {"tab_counts": {which: count(which) for which in TABS}}


@needs(READ)
def tab_count(request: HttpRequest, which: str) -> HttpResponse:
    """One tab's count as the ``<span>`` the navigation shows."""
    if which not in TABS:
        raise Http404(f"no tab {which}")
    return TemplateResponse(request, "console/tab_count.html", {"which": which, "n": count(which)})
