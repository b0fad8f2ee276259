"""Probes for load balancers and the Prometheus scrape endpoint.

- ``/healthz``: the process is up and its event loop turns (no I/O): 200 ``{"status": "ok"}``.
  It is a URL of the console (``console:healthz``, so that a host mounting the console
  under a prefix has one too, and the console's script probes it when the server seems
  gone); this repository's ``console.asgi`` answers that path on the event loop, before
  Django: a liveness probe must not wait behind request threads held by a database lock, or
  a long migration would get every web process restarted.
- ``/readyz``: the database answers, every migration is applied, the channel layer
  answers and the console's static files have URLs (collected, with a manifest): 200
  ``{"status": "ready", "checks": {...}}``, else 503 with the failing check's reason
  (``"checks": {"database": "ok", "migrations": "2 unapplied: ...", ...}``).
- ``/metrics``: the Prometheus text format of this process (runtime.metrics), guarded by
  RUNTIME_METRICS: ``loopback`` (default: only from 127.0.0.1 / ::1), ``open`` or ``off``
  (404); with RUNTIME_METRICS_TOKEN set, a request must carry ``Authorization: Bearer
  <token>`` (401 otherwise) from anywhere unless RUNTIME_METRICS is ``off``.

None of them needs a session, so they answer before sign-in; none writes anything.
"""

from __future__ import annotations

import hmac
import ipaddress
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.staticfiles.storage import staticfiles_storage
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from runtime import conf, metrics
from runtime.db import unapplied_migrations

NO_STORE = b"max-age=0, no-cache, no-store, must-revalidate, private"


async def healthz(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/healthz`` as an ASGI application: 200 ``{"status": "ok"}`` to GET and HEAD (never
    cached), 405 to other methods."""
    if scope["method"] in ("GET", "HEAD"):
        status, body = 200, b'{"status": "ok"}'
        headers = [(b"content-type", b"application/json"), (b"cache-control", NO_STORE)]
    else:
        status, body = 405, b""
        headers = [(b"allow", b"GET, HEAD")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""})


@never_cache
@require_safe
def healthz_view(request: HttpRequest) -> JsonResponse:
    """``console:healthz`` through Django (a host's ASGI or WSGI server): the same answer as
    ``healthz``, 200 ``{"status": "ok"}`` to GET and HEAD, 405 otherwise."""
    return JsonResponse({"status": "ok"})


def check_database() -> str:
    """ "ok" when the default database answers ``SELECT 1``; raises otherwise."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "ok"


def check_migrations() -> str:
    """ "ok" when no migration is unapplied; raises RuntimeError naming the first few."""
    unapplied = unapplied_migrations()
    if unapplied:
        raise RuntimeError(f"{len(unapplied)} unapplied: {', '.join(unapplied[:3])}")
    return "ok"


def check_channel_layer() -> str:
    """ "ok" when the channel layer takes a message and hands it back (a round trip to Redis
    with channels-redis); raises otherwise."""
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured")
    channel = async_to_sync(layer.new_channel)(prefix="readyz")
    probe = {"type": "readyz.probe", "id": uuid.uuid4().hex}
    async_to_sync(layer.send)(channel, probe)
    if async_to_sync(layer.receive)(channel) != probe:
        raise RuntimeError("the channel layer returned another message")
    return "ok"


def check_static_files() -> str:
    """ "ok" when the console's stylesheet has a URL; raises when the static files storage
    cannot name it (RUNTIME_STATIC_MANIFEST=1 before ``manage.py collectstatic``: every
    console page would be a 500)."""
    staticfiles_storage.url(PROBE_STATIC)
    return "ok"


PROBE_STATIC = "console/console.css"  # every console page links it


def check_worker() -> str:
    """The in-process worker's state (``runtime_serve``): "ok", or why it cannot work (the
    database unreachable, its pool exhausted); "ok" where the process runs none."""
    from runtime.worker import problems

    return "; ".join(problems()) or "ok"


CHECKS: dict[str, Callable[[], str]] = {
    "database": check_database,
    "migrations": check_migrations,
    "channel_layer": check_channel_layer,
    "static_files": check_static_files,
    "worker": check_worker,
}


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Run every readiness check; 200 when all pass, 503 naming each failure."""
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            results[name] = check()
        except Exception as exc:  # any failure is the answer, never a 500
            results[name] = f"{type(exc).__name__}: {exc}"
    ready = all(value == "ok" for value in results.values())
    return JsonResponse(
        {"status": "ready" if ready else "unready", "checks": results},
        status=200 if ready else 503,
    )


def _loopback(request: HttpRequest) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _bearer(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus exposition of this process, with the log's gauges (see module doc)."""
    access = conf.metrics_access()
    token = conf.metrics_token()
    if access == "off":
        raise Http404("metrics are off (RUNTIME_METRICS=off)")
    if token:
        if not hmac.compare_digest(_bearer(request).encode(), token.encode()):
            response = HttpResponse("a metrics token is required\n", status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    elif access == "loopback" and not _loopback(request):
        return HttpResponse("metrics are served to loopback clients only\n", status=403)
    return HttpResponse(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)
