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
  (``"checks": {"database": "ok", "migrations": "2 unapplied: ...", ...}``). The database
  part (``probe_database``: ``database``, ``pool``, ``runs_table``) answers within a second
  whatever the database does: down, its pool exhausted, its runs' table locked.
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
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from runtime import conf, db, metrics
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


# The database probes' bounds (seconds): together well under a second, so that ``/readyz``
# answers within one whatever the database does (issue 31, item 8: it waited the pool's
# timeout twice, 10 s, when the database was down or the pool exhausted).
POOL_WAIT = 0.25  # for a pooled connection
STATEMENT_WAIT = 0.25  # for each of the probe's statements
LOCK_WAIT = 0.15  # for the lock a request needs on the runs' table


def answered(results: dict[str, str]) -> bool:
    """Whether ``probe_database``'s ``results`` say the database answered."""
    return results["database"] == "ok" and results["pool"] == "ok"


def probe_database() -> dict[str, str]:
    """Probe the runtime's database within about POOL_WAIT + 2 x STATEMENT_WAIT seconds.

    Returns {"database", "pool", "runs_table"}, each "ok" or why not:

    - ``database``: a connection answers ``SELECT 1``; otherwise the error (PostgreSQL's pool:
      no connection came within POOL_WAIT while the pool could open more, so it could not
      make one).
    - ``pool``: psycopg_pool's state (``get_stats()``, read before the probe asked) when no
      connection came within POOL_WAIT and every connection was lent when it asked:
      "exhausted: N of N connections lent, W requests waiting" (what every request then
      waits for); "ok" otherwise and without a pool.
    - ``runs_table``: on PostgreSQL, ``LOCK TABLE runtime_run IN ROW EXCLUSIVE MODE`` (the
      lock every write of a run takes; it waits for any lock that holds reads or writes
      back) under a LOCK_WAIT ``lock_timeout``, then rolled back: "locked: ..." when another
      session holds such a lock (a migration, a stuck transaction). On SQLite the runs are
      read (a writer never holds readers back there).

    With a pool the probe borrows its own connection (``pool.connection(timeout=...)``), not
    the request's: Django's would wait the pool's whole timeout. Its bounds are ``SET
    LOCAL`` in the probe's transaction, so they neither meet the web request's own bounds
    (console.timeouts, set on the request's connection) nor outlive the probe.
    """
    found = {"database": "ok", "pool": "ok", "runs_table": "ok"}
    wrapper = db.wrapper()
    pool = getattr(wrapper, "pool", None)
    if pool is not None:
        _probe_pooled(pool, found)
    else:
        _probe_unpooled(wrapper, found)
    return found


def _probe_pooled(pool: Any, found: dict[str, str]) -> None:
    from psycopg_pool import PoolTimeout

    pool.open()  # as Django does before its first connection (no wait: it fills in the back)
    # Read before asking: psycopg_pool counts a connection it is still trying to make in its
    # size, so once the probe waits, a pool that cannot reach the database looks full too.
    stats = pool.get_stats()
    try:
        with pool.connection(timeout=POOL_WAIT) as conn, conn.transaction(force_rollback=True):
            for sql in _bounds():
                conn.execute(sql, prepare=False)
            conn.execute("SELECT 1", prepare=False)
            try:
                with conn.transaction():  # a savepoint: a refusal leaves the probe usable
                    conn.execute(_lock_sql(), prepare=False)
            except Exception as exc:
                found["runs_table"] = _lock_refusal(exc)
    except PoolTimeout as exc:
        size, most = stats.get("pool_size", 0), stats.get("pool_max", 0)
        if size >= most and not stats.get("pool_available", 0):
            waiting = stats.get("requests_waiting", 0)
            found["pool"] = (
                f"exhausted: {size} of {most} connections lent, {waiting} requests waiting; "
                f"none came within {POOL_WAIT} s"
            )
            found["database"] = "not checked: the pool lent no connection"
        else:
            found["database"] = (
                f"no connection within {POOL_WAIT} s, and the pool could not open one "
                f"({size} of {most} open or opening): {exc}"
            )
    except Exception as exc:  # any failure is the answer
        found["database"] = f"{type(exc).__name__}: {exc}"
    if not answered(found):
        found["runs_table"] = "not checked: the database did not answer"


def _probe_unpooled(wrapper: Any, found: dict[str, str]) -> None:
    """The probe on the request's own connection (SQLite; PostgreSQL without a pool, where
    each connection is its own session: nothing to wait for but the connect)."""
    from runtime.models import Run  # the models are ready by the first request, not at import

    try:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")  # first, outside the probe's transaction: see below
            cursor.fetchone()
    except Exception as exc:
        found["database"] = f"{type(exc).__name__}: {exc}"
        found["runs_table"] = "not checked: the database did not answer"
        return
    try:
        if wrapper.vendor != "postgresql":
            Run.objects.using(wrapper.alias).values_list("id", flat=True).first()
            return
        # The web request's bounds (console.timeouts) were set by the SELECT above, on the
        # session; the probe's own are local to this transaction, which is rolled back.
        with transaction.atomic(using=wrapper.alias), wrapper.cursor() as cursor:
            for sql in _bounds():
                cursor.execute(sql)
            cursor.execute(_lock_sql())
            transaction.set_rollback(True, using=wrapper.alias)
    except Exception as exc:
        found["runs_table"] = _lock_refusal(exc)


def _bounds() -> list[str]:
    return [
        f"SET LOCAL statement_timeout = {round(STATEMENT_WAIT * 1000)}",
        f"SET LOCAL lock_timeout = {round(LOCK_WAIT * 1000)}",
    ]


def _lock_sql() -> str:
    from runtime.models import Run

    return f"LOCK TABLE {db.wrapper().ops.quote_name(Run._meta.db_table)} IN ROW EXCLUSIVE MODE"


def _lock_refusal(exc: BaseException) -> str:
    """What the runs' table probe says when its statement failed with ``exc``."""
    from runtime.models import Run

    sqlstate = getattr(exc.__cause__ if exc.__cause__ is not None else exc, "sqlstate", None)
    which = db.timed_out(exc) or {"55P03": "lock", "57014": "statement"}.get(sqlstate or "")
    if which == "lock":
        return (
            f"locked: another session holds a lock on {Run._meta.db_table} that requests "
            f"wait for (no write lock within {LOCK_WAIT} s)"
        )
    if which == "statement":
        return f"no answer within {STATEMENT_WAIT} s (statement timeout)"
    return f"{type(exc).__name__}: {exc}"


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
    "migrations": check_migrations,
    "channel_layer": check_channel_layer,
    "static_files": check_static_files,
    "worker": check_worker,
}
DATABASE_CHECKS = ("migrations",)  # read through the database: not tried when it did not answer


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Probe the database (``probe_database``), then run every other readiness check (the
    ones of DATABASE_CHECKS only when the database answered); 200 when all pass, 503 naming
    each failure."""
    results = probe_database()
    for name, check in CHECKS.items():
        if name in DATABASE_CHECKS and not answered(results):
            results[name] = "not checked: the database did not answer"
            continue
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
