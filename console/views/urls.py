"""The console's pages and actions (the JSON API lives under api/v1/)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, register_converter

from console import health
from console.views import (
    audit,
    moves,
    reconcile,
    runs,
    tabs,
    tickets,
    tokens,
    webhooks,
    workers,
)
from runtime.untrusted import ID_PATTERN

app_name = "console"


class IdConverter:
    """An id the runtime issues; any other path segment is a 404 before a view runs."""

    regex = ID_PATTERN.strip("^$")

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(IdConverter, "id")

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", health.healthz_view, name="healthz"),
    path("", runs.runs, name="runs"),
    path("runs/new/", runs.start_run, name="start"),
    path("runs/cancel/", runs.bulk_cancel, name="bulk_cancel"),
    path("runs/pause/", runs.bulk_pause, name="bulk_pause"),
    path("runs/move/", moves.move_runs, name="move"),
    path("runs/<id:run_id>/", runs.run_detail, name="run"),
    path("runs/<id:run_id>/cancel/", runs.cancel_run, name="cancel"),
    path("runs/<id:run_id>/pause/", runs.pause_run, name="pause"),
    path("runs/<id:run_id>/resume-paused/", runs.resume_paused, name="resume_paused"),
    path("runs/<id:run_id>/again/", runs.run_again, name="run_again"),
    path("runs/<id:run_id>/fork/", runs.fork_run, name="fork"),
    path("inbox/", tickets.inbox, name="inbox"),
    path("inbox/bulk/", tickets.bulk_answer, name="bulk_answer"),
    path("tickets/<id:ticket_id>/", tickets.ticket_detail, name="ticket"),
    path("tickets/<id:ticket_id>/answer/", tickets.answer_ticket, name="answer"),
    path("reconcile/", reconcile.reconciliation, name="reconcile"),
    path("reconcile/bulk/", reconcile.bulk_not_applied, name="reconcile_bulk"),
    path("reconcile/<id:call_id>/", reconcile.reconcile_call, name="reconcile_call"),
    path("audit/", audit.audit, name="audit"),
    path("workers/", workers.workers, name="workers"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("webhooks/", webhooks.endpoints, name="webhooks"),
    path("webhooks/<id:endpoint_id>/", webhooks.endpoint, name="webhook"),
    path(
        "webhooks/<id:endpoint_id>/<str:action>/",
        webhooks.endpoint_action,
        name="webhook_action",
    ),
    path("tabs/<str:which>/", tabs.tab_count, name="tab_count"),
    path("tokens/<int:token_id>/revoke/", tokens.revoke_token, name="revoke_token"),
]
