"""``manage.py runtime_webhook``: manage outgoing webhook endpoints and read their log.

runtime_webhook add --url URL --event run.ended [--event ...] [--name N] [--secret S]
runtime_webhook list [--json]
runtime_webhook show ID [--json]          # with its secret
runtime_webhook enable ID | disable ID | remove ID | rotate ID
runtime_webhook test ID                   # queue a signed webhook.test event
runtime_webhook deliveries ID [--state pending|delivered|failed] [--limit N] [--json]
"""

from __future__ import annotations

import getpass
import json

from django.core.management.base import CommandError

from runtime import webhooks
from runtime.domain.webhooks import SUBSCRIBABLE
from runtime.errors import RuntimeFault
from runtime.management.base import RuntimeCommand
from runtime.models import WebhookDelivery, WebhookEndpoint


def _cli() -> str:
    """Who acts from the command line, as recorded (``cli:<login>``)."""
    return f"cli:{getpass.getuser()}"


class Command(RuntimeCommand):
    help = "Manage outgoing webhook endpoints (add, list, show, enable, disable, remove, "
    "rotate, test) and print an endpoint's delivery log."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="create an endpoint; prints its id and secret")
        add.add_argument("--url", required=True)
        add.add_argument(
            "--event", action="append", required=True, choices=[e.value for e in SUBSCRIBABLE]
        )
        add.add_argument("--name", default="")
        add.add_argument("--secret", default="", help="whsec_ base64; generated when left out")
        add.add_argument("--json", action="store_true")
        listing = sub.add_parser("list", help="every endpoint")
        listing.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="one endpoint, with its secret")
        show.add_argument("endpoint_id")
        show.add_argument("--json", action="store_true")
        for name in ("enable", "disable", "remove", "rotate", "test"):
            sub.add_parser(name).add_argument("endpoint_id")
        log = sub.add_parser("deliveries", help="an endpoint's delivery log, newest first")
        log.add_argument("endpoint_id")
        log.add_argument("--state", choices=["pending", "delivered", "failed"])
        log.add_argument("--limit", type=int, default=20)
        log.add_argument("--json", action="store_true")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc

    def _print(self, document, as_json: bool, line: str) -> None:
        self.stdout.write(json.dumps(document, indent=2) if as_json else line)

    def _add(self, *, url, event, name, secret, json: bool, **_):
        endpoint = webhooks.create_endpoint(
            url=url, events=event, name=name, secret=secret, actor=_cli()
        )
        document = webhooks.endpoint_document(endpoint, secret=True)
        self._print(document, json, f"{endpoint.id} {endpoint.secret}")

    def _list(self, *, json: bool, **_):
        rows = [
            webhooks.endpoint_document(e) for e in WebhookEndpoint.objects.order_by("created_at")
        ]
        lines = [
            f"{e['id']}  {'on ' if e['enabled'] else 'off'}  {e['url']}  {','.join(e['events'])}"
            for e in rows
        ]
        self._print(rows, json, "\n".join(lines) or "no webhook endpoints")

    def _show(self, *, endpoint_id, json: bool, **_):
        document = webhooks.endpoint_document(webhooks.get_endpoint(endpoint_id), secret=True)
        self._print(document, json, "\n".join(f"{k}: {v}" for k, v in document.items()))

    def _enable(self, *, endpoint_id, **_):
        webhooks.update_endpoint(endpoint_id, enabled=True, actor=_cli())
        self.stdout.write(f"{endpoint_id}: enabled")

    def _disable(self, *, endpoint_id, **_):
        webhooks.update_endpoint(endpoint_id, enabled=False, actor=_cli())
        self.stdout.write(f"{endpoint_id}: disabled (its deliveries wait until it is enabled)")

    def _remove(self, *, endpoint_id, **_):
        webhooks.delete_endpoint(endpoint_id, actor=_cli())
        self.stdout.write(f"{endpoint_id}: removed")

    def _rotate(self, *, endpoint_id, **_):
        endpoint = webhooks.update_endpoint(endpoint_id, rotate_secret=True, actor=_cli())
        self.stdout.write(f"{endpoint_id} {endpoint.secret}")

    def _test(self, *, endpoint_id, **_):
        delivery = webhooks.send_test(endpoint_id, actor=_cli())
        self.stdout.write(f"{endpoint_id}: test event {delivery.message_id} queued")

    def _deliveries(self, *, endpoint_id, state, limit, json: bool, **_):
        rows = WebhookDelivery.objects.filter(endpoint=webhooks.get_endpoint(endpoint_id))
        if state:
            rows = rows.filter(state=state)
        page = rows.prefetch_related("attempt_log").order_by("-created_at", "-id")[: max(limit, 1)]
        documents = [webhooks.delivery_document(d) for d in page]
        lines = [
            f"{d['created_at']}  {d['kind']:<18} {d['state']:<9} attempts={d['attempts']} "
            f"status={d['last_status'] or '-'} {d['last_error'][:80]}"
            for d in documents
        ]
        self._print(documents, json, "\n".join(lines) or "no deliveries")
