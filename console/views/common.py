"""What every console view shares: the request type, permission guards, error rendering.

Every write goes through ``runtime.operations``; a refused operation raises a RuntimeFault,
which the views render with its own status code (403, 404, 409, 422) and message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import wraps
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import resolve_url
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.views.decorators.http import require_POST
from django_htmx.middleware import HtmxDetails

from console.models import OPERATE, READ, RESUME
from runtime.agents import registry
from runtime.untrusted import is_id

if TYPE_CHECKING:
    from django.contrib.auth.models import User


MAX_NUMBER = 2**63 - 1  # a commit's seq or a step fits a signed 64-bit column everywhere
_DIGITS = re.compile(r"[0-9]{1,19}")


def whole_number(raw: str) -> int | None:
    """Read a whole number from a query string or a form field: ASCII digits only, at most
    MAX_NUMBER; None for anything else. ``str.isdigit`` is no test: it accepts "²", which
    ``int`` refuses, and "٣", which it reads as 3; ``int`` also refuses over 4,300 digits."""
    if not _DIGITS.fullmatch(raw):
        return None
    number = int(raw)
    return number if number <= MAX_NUMBER else None


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


class AuthenticatedHtmxRequest(HtmxHttpRequest):
    """The request of a view behind ``login_required``: its user is signed in."""

    user: User


View = Callable[..., HttpResponse]


def needs(permission: str, *, write: bool = False) -> Callable[[View], View]:
    """Guard a view: sign-in first, then ``permission`` (403); writes are POST only.

    Anonymous visitors are sent to the sign-in page (an htmx request of an expired session gets
    ``HX-Redirect``, so the whole page goes, not a fragment); a signed-in user without the
    permission gets 403, and so does every write a viewer attempts.
    """

    def decorate(view: View) -> View:
        @wraps(view)
        def guarded(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                if request.htmx:
                    back = request.htmx.current_url_abs_path or "/"
                    response = HttpResponse(status=401)
                    response["HX-Redirect"] = (
                        f"{resolve_url(settings.LOGIN_URL)}?{urlencode({'next': back})}"
                    )
                    return response
                return redirect_to_login(request.get_full_path())
            if not request.user.has_perm(permission):
                why = f"You need the {permission.split('.')[-1]} permission for this."
                if request.htmx:  # a fragment for the swap target, not a whole page
                    return HttpResponseForbidden(
                        format_html('<p class="error" role="alert">{}</p>', why)
                    )
                raise PermissionDenied(why)
            return view(request, *args, **kwargs)

        return require_POST(guarded) if write else guarded

    return decorate


def form_problem(form: forms.Form) -> str:
    """A form's errors as one line ("Reason: ...")."""
    return " ".join(
        f"{name.capitalize()}: {error}" for name, errors in form.errors.items() for error in errors
    )


def actor(request: HttpRequest) -> str:
    """The name every operation records as who acted."""
    return request.user.get_username()


def abilities(request: HttpRequest) -> dict[str, bool]:
    """What the signed-in user may do, for showing only the actions they can take."""
    user = request.user
    return {
        "can_read": user.has_perm(READ),
        "can_resume": user.has_perm(RESUME),
        "can_operate": user.has_perm(OPERATE),
    }


# Counts past this are shown as "1,000+": an exact count would read every matching row.
COUNT_CAP = 1000


def capped(rows: QuerySet[Any]) -> int | str:
    """How many ``rows`` there are, up to COUNT_CAP; past it, the text "1,000+": a COUNT over
    a LIMITed subquery reads at most COUNT_CAP + 1 index entries, however long the history."""
    n = rows.order_by().values("pk")[: COUNT_CAP + 1].count()
    return n if n <= COUNT_CAP else f"{COUNT_CAP:,}+"


def choices(*groups: Iterable[str | None]) -> list[str]:
    """A filter's options, sorted, without blanks: the names the code knows (the registered
    agents, their tools), those on the page shown and the one chosen. Never read from the
    history: a distinct over every open ticket or queued call grows with them (issue 28)."""
    return sorted({name for group in groups for name in group if name})


def registered_tools() -> set[str]:
    """The names of the registered agents' own tools (a tool source's, e.g. MCP, are known
    only when a worker asks the server: a filter lists them once a page shows one)."""
    return {tool.name for agent in registry().values() for tool in agent.tools}


def render_page(
    request: HtmxHttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    partial: str | None = None,
    status: int = 200,
) -> HttpResponse:
    """Render the whole page, or only ``partial`` for an htmx request that asks for it."""
    htmx = request.htmx
    wants_partial = bool(htmx) and not htmx.boosted and not htmx.history_restore_request
    name = f"{template}#{partial}" if partial and wants_partial else template
    return TemplateResponse(request, name, {**abilities(request), **context}, status=status)


def parse_cursor(raw: str) -> tuple[datetime, str] | None:
    """Read a keyset cursor ``<ISO time>~<id>`` from a query string: (time, id), or None for
    anything else (a crafted cursor is untrusted text: only an id the runtime could have issued
    reaches the database)."""
    stamp, _, ident = raw.partition("~")
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return (when, ident) if is_id(ident) else None
