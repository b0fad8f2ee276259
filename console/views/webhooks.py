"""Webhooks: the endpoints that receive committed events, each with its delivery log and a
"send test" button. Viewers read; operators create, enable, disable, rotate, test and delete
(the same functions as the API and ``runtime_webhook``: ``runtime.webhooks``). Rotate and
delete are confirmed first; every change is recorded for the Audit page."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect

from console.forms import WebhookConfirmForm, WebhookForm
from console.models import OPERATE, READ
from console.views.common import HtmxHttpRequest, actor, needs, render_page
from runtime import webhooks
from runtime.errors import RuntimeFault
from runtime.models import WebhookDelivery, WebhookEndpoint

LOG_ROWS = 50


@needs(READ)
def endpoints(request: HtmxHttpRequest) -> HttpResponse:
    """The endpoints, with their pending and failed counts; POST (operate) creates one and
    shows its secret once here (it stays readable on the endpoint's page to operators)."""
    form = WebhookForm()
    status, created = 200, None
    if request.method == "POST":
        if not request.user.has_perm(OPERATE):
            return HttpResponse("You need the operate_runs permission for this.", status=403)
        form = WebhookForm(request.POST)
        if form.is_valid():
            try:
                created = webhooks.create_endpoint(
                    url=form.cleaned_data["url"],
                    events=form.cleaned_data["events"],
                    name=form.cleaned_data["name"],
                    actor=actor(request),
                )
                form, status = WebhookForm(), 201
            except RuntimeFault as exc:
                form.add_error("url", exc.message)
        if created is None:
            status = 400
    rows = list(WebhookEndpoint.objects.order_by("created_at", "id"))
    for row in rows:
        row.url = webhooks.shown_url(row.url)  # for the page only, never saved
        counts = row.deliveries.values_list("state", flat=True)
        row.pending = sum(1 for s in counts if s == "pending")  # type: ignore[attr-defined]
        row.failed = sum(1 for s in counts if s == "failed")  # type: ignore[attr-defined]
    context = {"endpoints": rows, "form": form, "created": created}
    return render_page(request, "console/webhooks.html", context, status=status)


@needs(READ)
def endpoint(request: HtmxHttpRequest, endpoint_id: str) -> HttpResponse:
    """One endpoint and its delivery log (newest first, every attempt with its response
    code or error; a failed response's body to operators only); the log re-renders alone
    every few seconds (htmx)."""
    try:
        found = webhooks.get_endpoint(endpoint_id)
    except RuntimeFault as exc:
        return HttpResponse(exc.message, status=404)
    log = list(
        WebhookDelivery.objects.filter(endpoint=found)
        .prefetch_related("attempt_log")
        .order_by("-created_at", "-id")[:LOG_ROWS]
    )
    operator = request.user.has_perm(OPERATE)
    found.url = webhooks.shown_url(found.url)  # for the page only, never saved
    for delivery in log:  # a receiver's answer only to operators (webhooks.shown_error)
        delivery.last_error = webhooks.shown_error(
            delivery.last_status, delivery.last_error, bodies=operator
        )
        for attempt in delivery.attempt_log.all():
            attempt.error = webhooks.shown_error(
                attempt.status_code, attempt.error, bodies=operator
            )
    context = {"endpoint": found, "deliveries": log, "show_secret": operator}
    return render_page(request, "console/webhook.html", context, partial="log")


CONFIRMED = ("rotate", "delete")  # actions that need the confirm field (WebhookConfirmForm)


@needs(OPERATE, write=True)
def endpoint_action(request: HtmxHttpRequest, endpoint_id: str, action: str) -> HttpResponse:
    """test | enable | disable | rotate | delete, then back to the page (the list after a
    delete); every change is recorded for Audit (``runtime.webhooks``, by the user).

    ``rotate`` and ``delete`` take effect only with ``confirm``: a POST without it changes
    nothing and answers the confirmation form, which says what the action affects (the
    endpoint's pending deliveries: dropped by a delete, signed with the new secret after a
    rotation). 404 for an unknown endpoint or action."""
    who = actor(request)
    try:
        if action in CONFIRMED:
            form = WebhookConfirmForm(request.POST)
            if not form.is_valid():
                found = webhooks.get_endpoint(endpoint_id)
                found.url = webhooks.shown_url(found.url)  # for the page only, never saved
                context = {
                    "endpoint": found,
                    "action": action,
                    "form": form if "confirm" in request.POST else WebhookConfirmForm(),
                    "pending": webhooks.pending_count(endpoint_id),
                }
                status = 400 if "confirm" in request.POST else 200
                return render_page(request, "console/webhook_confirm.html", context, status=status)
        if action == "test":
            delivery = webhooks.send_test(endpoint_id, actor=who)
            messages.success(request, f"Test event {delivery.message_id} queued.")
        elif action in ("enable", "disable"):
            webhooks.update_endpoint(endpoint_id, enabled=action == "enable", actor=who)
            messages.success(request, f"Endpoint {action}d.")
        elif action == "rotate":
            webhooks.update_endpoint(endpoint_id, rotate_secret=True, actor=who)
            messages.success(request, "A new secret is in use; update your receiver.")
        elif action == "delete":
            pending = webhooks.delete_endpoint(endpoint_id, actor=who)
            messages.success(
                request,
                f"Endpoint deleted with {pending} pending deliver{'y' if pending == 1 else 'ies'}.",
            )
            return redirect("console:webhooks")
        else:
            return HttpResponse("unknown action", status=404)
    except RuntimeFault as exc:
        return HttpResponse(exc.message, status=exc.status)
    return redirect("console:webhook", endpoint_id=endpoint_id)
