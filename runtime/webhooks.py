"""Outgoing webhooks: endpoints, signatures, and the at-least-once delivery of the outbox.

The guarantee: every webhook event of a commit (``domain.webhooks.notifications``) is written
to the outbox (``WebhookDelivery``, one row per subscribed endpoint) by the commit's own write
(``runtime.coordinator``), so an event exists if and only if its commit does. Workers deliver
it at least once: a claim leases due rows (``SKIP LOCKED`` on PostgreSQL; SQLite has one
writer) for the request's timeout and 5 s more, so a worker killed mid-request leaves the row
to another worker when the lease lapses. A run's events reach an endpoint in commit order:
only the earliest pending event of a (run, endpoint) is claimable, so a later event waits until
the earlier one was delivered or given up. A failed attempt is retried with exponential
backoff and jitter (``domain.webhooks.next_attempt``) up to RUNTIME_WEBHOOK_MAX_ATTEMPTS, then
the delivery is ``failed``. Deliveries run on the worker's event loop beside its runs and never
on their path: a commit only inserts rows; a slow or failing receiver costs a run nothing.

Requests are signed as Standard Webhooks specifies (``webhook-id``, ``webhook-timestamp``,
``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, with the endpoint's
``whsec_`` secret), by the ``standardwebhooks`` package; receivers verify with any Standard
Webhooks library.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import random
import socket
import time
import unicodedata
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.db.models import Exists, F, Min, OuterRef, Q
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from runtime import conf, db, metrics
from runtime.db import db_later, db_now
from runtime.domain.webhooks import (
    SUBSCRIBABLE,
    AllowList,
    GiveUp,
    WebhookEvent,
    host_problem,
    literal_address,
    next_attempt,
)
from runtime.errors import NotFound, WebhookRefused
from runtime.models import (
    WebhookAttempt,
    WebhookChange,
    WebhookDelivery,
    WebhookEndpoint,
    new_webhook_secret,
)

log = logging.getLogger("runtime.webhooks")

USER_AGENT = "durable-agent-runtime-webhooks/1"
ERROR_CHARS = 500  # of a failed response's body or an exception, kept in the log
ERROR_BYTES = 2048  # read of a failed response's body at most (a 2xx body is not read)
MAX_URL = 2000


# -- endpoints: the one place the console, the API and the CLI manage them -----------------------


def _events(events: Iterable[str]) -> list[str]:
    chosen = sorted(set(events))
    unknown = [e for e in chosen if e not in SUBSCRIBABLE]
    if unknown or not chosen:
        raise WebhookRefused(
            f"events must be one or more of {', '.join(SUBSCRIBABLE)}",
            unknown=unknown,
            allowed=list(SUBSCRIBABLE),
        )
    return chosen


def allow_list() -> AllowList:
    """RUNTIME_WEBHOOK_ALLOW_HOSTS, parsed (the system check runtime.E004 vets it)."""
    return AllowList.parse(conf.webhook_allow_hosts())


def url_problem(url: str, allow: AllowList | None = None) -> str | None:
    """Why webhooks may not be sent to ``url``, or None: the one check of every surface (the
    API, the console, ``runtime_webhook``) and of every attempt. An http(s) URL httpx parses,
    with a host, without credentials, whitespace or control characters (a CR/LF would make
    every attempt fail), with a port (if any) from 1 to 65535, at most 2000 characters, whose
    host is not internal by its name (``domain.webhooks.host_problem``; the addresses a name
    resolves to are checked when sending)."""
    if len(url) > MAX_URL:
        return f"the URL is longer than {MAX_URL} characters"
    if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in url):
        return "the URL holds whitespace or control characters"
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        return f"the URL does not parse: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "the URL must be an http or https URL with a host"
    if parsed.userinfo:
        return "the URL must not hold credentials (user:password@): verify the signature instead"
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return f"the URL's port must be 1 to 65535, not {parsed.port}"
    return host_problem(parsed.host, allow or allow_list())


def _url(url: str) -> str:
    if problem := url_problem(url):
        raise WebhookRefused(problem, url=shown_url(url)[:200])
    return url


def shown_url(url: str) -> str:
    """``url`` without credentials (a ``user:password@`` saved before they were refused)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _secret(secret: str) -> str:
    try:
        raw = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) < 24:
        raise WebhookRefused("a secret is whsec_ and at least 24 bytes in base64")
    return secret if secret.startswith("whsec_") else f"whsec_{secret}"


def _record(endpoint: WebhookEndpoint, action: str, actor: str, **detail: Any) -> None:
    WebhookChange.objects.create(
        endpoint_id=endpoint.id,
        endpoint_name=endpoint.name,
        url=shown_url(endpoint.url),
        action=action,
        actor=actor[:200],
        detail=detail,
    )


def create_endpoint(
    *, url: str, events: Iterable[str], name: str = "", secret: str = "", actor: str = ""
) -> WebhookEndpoint:
    """Create an enabled endpoint; return it (its ``secret`` is generated unless given), and
    record the change (``WebhookChange`` "create", by ``actor``). Raises WebhookRefused for a
    URL ``url_problem`` refuses, an unknown or empty event list, or a secret that is not
    ``whsec_`` base64 of at least 24 bytes; nothing is written then."""
    with db.atomic():
        endpoint = WebhookEndpoint.objects.create(
            url=_url(url),
            events=_events(events),
            name=name[:100],
            secret=_secret(secret) if secret else new_webhook_secret(),
            created_by=actor[:150],
        )
        _record(endpoint, "create", actor, events=endpoint.events)
    return endpoint


def get_endpoint(endpoint_id: str) -> WebhookEndpoint:
    """Return the endpoint; raises NotFound."""
    endpoint = WebhookEndpoint.objects.filter(id=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"webhook endpoint {endpoint_id} does not exist")
    return endpoint


def pending_count(endpoint_id: str) -> int:
    """How many of the endpoint's deliveries are still pending (a delete drops them)."""
    return WebhookDelivery.objects.filter(endpoint_id=endpoint_id, state="pending").count()


def update_endpoint(
    endpoint_id: str,
    *,
    url: str | None = None,
    events: Iterable[str] | None = None,
    name: str | None = None,
    enabled: bool | None = None,
    rotate_secret: bool = False,
    actor: str = "",
) -> WebhookEndpoint:
    """Change what is given; return the endpoint. Events already in the outbox keep going to
    it (a disabled endpoint's wait until it is enabled again). Each change is recorded
    (``WebhookChange`` by ``actor``: "enable" / "disable" when ``enabled`` changes it,
    "rotate" for a new secret, "update" for url, events or name). Raises NotFound and
    WebhookRefused (nothing is changed)."""
    endpoint = get_endpoint(endpoint_id)
    changed = []
    if url is not None:
        endpoint.url = _url(url)
    if events is not None:
        endpoint.events = _events(events)
    if name is not None:
        endpoint.name = name[:100]
    if url is not None or events is not None or name is not None:
        changed.append("update")
    if enabled is not None and enabled != endpoint.enabled:
        changed.append("enable" if enabled else "disable")
        endpoint.enabled = enabled
    if rotate_secret:
        endpoint.secret = new_webhook_secret()
        changed.append("rotate")
    with db.atomic():
        endpoint.save()
        for action in changed:
            _record(endpoint, action, actor)
    return endpoint


def delete_endpoint(endpoint_id: str, *, actor: str = "") -> int:
    """Delete the endpoint and its deliveries; return how many of them were pending, and
    record the change (``WebhookChange`` "delete" with that count, by ``actor``). Raises
    NotFound."""
    with db.atomic():
        endpoint = get_endpoint(endpoint_id)
        pending = pending_count(endpoint_id)
        _record(endpoint, "delete", actor, pending=pending)
        endpoint.delete()
    return pending


def send_test(endpoint_id: str, *, actor: str = "") -> WebhookDelivery:
    """Queue a ``webhook.test`` event for this endpoint only (enabled or not: it is sent
    anyway); return its delivery, which a worker sends like any other. Raises NotFound."""
    endpoint = get_endpoint(endpoint_id)
    now = timezone.now()
    message = f"msg_test_{uuid.uuid4().hex}"
    payload = {
        "type": WebhookEvent.TEST.value,
        "timestamp": now.isoformat(),
        "data": {"id": message, "endpoint_id": endpoint.id, "actor": actor, "url": None},
    }
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        message_id=message,
        kind=WebhookEvent.TEST.value,
        payload=payload,
        next_attempt_at=now,
        created_at=now,
    )


# -- delivery -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Due:
    """A claimed delivery: what to send where, and the attempt number that fences its record."""

    id: int
    endpoint_id: str
    url: str
    secret: str
    message_id: str
    payload: Any
    attempt: int


def _claimable(now: Any) -> Any:
    pending = WebhookDelivery.objects.filter(state="pending")
    earlier = pending.filter(endpoint_id=OuterRef("endpoint_id"), run_id=OuterRef("run_id")).filter(
        Q(seq__lt=OuterRef("seq")) | Q(seq=OuterRef("seq"), idx__lt=OuterRef("idx"))
    )
    test = Q(kind=WebhookEvent.TEST.value)
    return (
        pending.filter(next_attempt_at__lte=now)
        .filter(Q(endpoint__enabled=True) | test)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        .exclude(Exists(earlier))  # a run's events go out in commit order
    )


def claim_due(worker_id: str, limit: int, busy: Mapping[str, int] | None = None) -> list[Due]:
    """Lease up to ``limit`` due deliveries, oldest due first, for ``conf.webhook_lease()``;
    return them (each attempt counted at its claim: a request may have left before a crash).
    Rows other workers are claiming are skipped (SKIP LOCKED on PostgreSQL).

    At most RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY per endpoint, counting the ``busy`` ones
    (the caller's requests in flight by endpoint id): an endpoint that hangs cannot take every
    slot of a worker from the others."""
    if limit <= 0 or not _claimable(db_now()).exists():  # the usual answer, one statement
        return []
    with db.atomic():
        ids = _choose(limit, conf.webhook_endpoint_concurrency(), Counter(busy or {}))
        if not ids:
            return []
        WebhookDelivery.objects.filter(id__in=ids).update(
            lease_owner=worker_id,
            lease_expires_at=db_later(conf.webhook_lease()),
            attempts=F("attempts") + 1,
        )
        taken = WebhookDelivery.objects.filter(id__in=ids).values_list(
            "id",
            "endpoint_id",
            "endpoint__url",
            "endpoint__secret",
            "message_id",
            "payload",
            "attempts",
        )
        return [Due(*row) for row in taken]


def _choose(limit: int, per_endpoint: int, counts: Counter[str]) -> list[int]:
    """The ids to claim, oldest due first, skipping endpoints at ``per_endpoint``
    (``counts`` in flight, updated). Each round either fills ``limit`` or fills an endpoint,
    which the next round leaves out: at most ``limit`` rounds."""
    chosen: list[int] = []
    seen: set[int] = set()  # our own locks do not skip our own rows
    while len(chosen) < limit:
        full = [endpoint for endpoint, n in counts.items() if n >= per_endpoint]
        rows = (
            _claimable(db_now())
            .exclude(endpoint_id__in=full)
            .exclude(id__in=seen)
            .order_by("next_attempt_at", "id")
        )
        if db.connection.vendor == "postgresql":
            rows = rows.select_for_update(skip_locked=True, of=("self",))
        batch = list(rows.values_list("id", "endpoint_id")[: limit - len(chosen)])
        if not batch:
            break
        for row_id, endpoint_id in batch:
            seen.add(row_id)
            if counts[endpoint_id] < per_endpoint:
                chosen.append(row_id)
                counts[endpoint_id] += 1
    return chosen


def signed_request(due: Due, now: datetime | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one attempt, signed with the endpoint's secret (Standard
    Webhooks: ``webhook-id``, ``webhook-timestamp`` in Unix seconds, ``webhook-signature``)."""
    text = json.dumps(due.payload, separators=(",", ":"), ensure_ascii=False)
    at = now or datetime.now(UTC)
    signature = Webhook(due.secret).sign(due.message_id, at, text)
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": due.message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }
    return text.encode(), headers


@dataclass(frozen=True, slots=True)
class Answer:
    """What one attempt got: a status code, or an error (a timeout, a refused connection)."""

    status: int | None
    error: str
    started_at: datetime
    seconds: float

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Refused(Exception):
    """The attempt's URL, or an address its host resolves to, is refused (``url_problem``,
    ``domain.webhooks.internal``); nothing was sent."""


async def target(url: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """Where one attempt connects: the URL, headers and httpx extensions to send with.

    The host is resolved here (the event loop's getaddrinfo) and every address it resolves to
    must be public or allowed (RUNTIME_WEBHOOK_ALLOW_HOSTS); the request then connects to the
    first of them, with the ``Host`` header and, for https, the TLS server name (SNI and the
    certificate check) of the URL's host: pinned to the checked address, so a name that
    resolves again to an internal address (DNS rebinding) is not reached. A host allowed by
    name, or an IP literal (checked by ``url_problem``), is connected to as it is.
    Raises Refused, and OSError (socket.gaierror) when the name does not resolve."""
    allow = allow_list()
    if problem := url_problem(url, allow):
        raise Refused(problem)
    parsed = httpx.URL(url)
    host = parsed.raw_host.decode("ascii")
    if allow.names_host(parsed.host) or literal_address(host) is not None:
        return url, {}, {}
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [ip_address(str(info[4][0]).partition("%")[0]) for info in infos]
    refused = [a for a in addresses if not allow.permits(a)]
    if refused or not addresses:
        raise Refused(
            f"{host} resolves to {refused[0] if refused else 'nothing'}, an internal address"
            " (allow it in RUNTIME_WEBHOOK_ALLOW_HOSTS)"
        )
    pinned = parsed.copy_with(host=str(addresses[0]))
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return str(pinned), {"host": parsed.netloc.decode("ascii")}, extensions


async def _post(client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> Any:
    """POST and return (status, error): no byte of a 2xx body is read, and at most about
    ERROR_BYTES (one network read) of another body, undecoded (``accept-encoding:
    identity``, raw bytes: no decompression bomb), decoded leniently as UTF-8."""
    where, host, extensions = await target(url)
    headers = {**headers, **host, "accept-encoding": "identity"}
    limit = conf.webhook_timeout_seconds()
    async with client.stream(
        "POST", where, content=body, headers=headers, timeout=limit, extensions=extensions
    ) as response:
        if response.is_success:
            return response.status_code, ""
        read = bytearray()
        async for chunk in response.aiter_raw():
            read += chunk
            if len(read) >= ERROR_BYTES:
                break
    text = bytes(read[:ERROR_BYTES]).decode("utf-8", "replace")
    return response.status_code, text[:ERROR_CHARS]


async def send(client: httpx.AsyncClient, due: Due) -> Answer:
    """POST one signed attempt; never raises (a failure is an Answer with its error, so every
    attempt is recorded). The whole attempt (resolution, connection, request, the answer's
    status and a failed answer's first bytes) is bounded by RUNTIME_WEBHOOK_TIMEOUT_SECONDS;
    redirects are not followed. An unexpected exception is logged here, once, with its
    traceback."""
    body, headers = signed_request(due)
    started, clock = timezone.now(), time.monotonic()
    try:
        status, error = await asyncio.wait_for(
            _post(client, due.url, body, headers), conf.webhook_timeout_seconds()
        )
    except Exception as exc:  # every attempt is recorded, whatever went wrong
        if not isinstance(exc, httpx.HTTPError | TimeoutError | OSError | Refused):
            log.warning("webhooks: attempt %s of %s raised", due.attempt, due.id, exc_info=True)
        error = f"{type(exc).__name__}: {exc}".strip()[:ERROR_CHARS]
        return Answer(None, error, started, time.monotonic() - clock)
    return Answer(status, error, started, time.monotonic() - clock)


def record(due: Due, answer: Answer, *, worker_id: str) -> str:
    """Record one attempt in the delivery log and settle the delivery: ``delivered`` (2xx),
    ``retry`` (due again after the backoff) or ``failed`` (attempts spent); return which.

    Fenced on the attempt number: when the lease lapsed and another worker claimed the row
    meanwhile, the attempt is logged but the row is left to that worker.
    """
    now = timezone.now()
    fields: dict[str, Any] = {
        "lease_owner": None,
        "lease_expires_at": None,
        "last_status": answer.status,
        "last_error": answer.error,
    }
    if answer.delivered:
        outcome = "delivered"
        fields.update(state="delivered", finished_at=now)
    else:
        decision = next_attempt(
            due.attempt,
            max_attempts=conf.webhook_max_attempts(),
            base=conf.webhook_backoff_seconds(),
            cap=conf.webhook_backoff_max_seconds(),
            jitter=random.random(),
        )
        if isinstance(decision, GiveUp):
            outcome = "failed"
            fields.update(state="failed", finished_at=now)
        else:
            outcome = "retry"
            fields["next_attempt_at"] = now + timedelta(seconds=decision.delay)
    with db.atomic():
        WebhookDelivery.objects.filter(id=due.id, state="pending", attempts=due.attempt).update(
            **fields
        )
        WebhookAttempt.objects.create(
            delivery_id=due.id,
            number=due.attempt,
            worker=worker_id[:200],
            started_at=answer.started_at,
            duration_ms=int(answer.seconds * 1000),
            status_code=answer.status,
            error=answer.error,
            outcome=outcome,
        )
    metrics.webhook_attempted(outcome, answer.seconds)
    return outcome


class Deliverer:
    """A worker's delivery task: claims due deliveries while it has room for them (at most
    RUNTIME_WEBHOOK_CONCURRENCY in flight, RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY of them to
    one endpoint), sends each as its own task, records the answer, and looks again every
    RUNTIME_IDLE_POLL_SECONDS when there is nothing to send.

    ``db`` runs a blocking function on the worker's database threads. Cancelling ``serve``
    abandons the attempts in flight; their leases lapse and another worker sends them again.
    """

    def __init__(self, worker_id: str, db: Callable[..., Awaitable[Any]]) -> None:
        self.worker_id = worker_id
        self.db = db
        self.inflight: dict[asyncio.Task[None], str] = {}  # task: its endpoint
        self.room = asyncio.Event()

    async def serve(self) -> None:
        async with httpx.AsyncClient(follow_redirects=False) as client:
            try:
                while True:
                    await self._pass(client)
            finally:
                for task in self.inflight:
                    task.cancel()
                await asyncio.gather(*self.inflight, return_exceptions=True)

    def busy(self) -> Counter[str]:
        """Requests in flight by endpoint id."""
        return Counter(self.inflight.values())

    async def _pass(self, client: httpx.AsyncClient) -> None:
        free = conf.webhook_concurrency() - len(self.inflight)
        taken: list[Due] = []
        if free > 0:
            try:
                taken = await self.db(claim_due, self.worker_id, free, self.busy())
            except Exception:  # a database blip: the next pass tries again
                log.warning("webhooks: claiming deliveries failed", exc_info=True)
        for due in taken:
            task = asyncio.ensure_future(self._deliver(client, due))
            self.inflight[task] = due.endpoint_id
            task.add_done_callback(self._done)
        if taken and len(taken) == free:
            return  # more may be due: claim again at once
        self.room.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.room.wait(), conf.idle_poll_seconds())

    def _done(self, task: asyncio.Task[None]) -> None:
        self.inflight.pop(task, None)
        self.room.set()
        if not task.cancelled() and task.exception() is not None:  # retrieved: logged once
            log.error("webhooks: a delivery task failed", exc_info=task.exception())

    async def _deliver(self, client: httpx.AsyncClient, due: Due) -> None:
        answer = await send(client, due)
        try:
            outcome = await self.db(record, due, answer, worker_id=self.worker_id)
        except Exception:  # unrecorded: the lease lapses and the event is sent again
            log.warning("webhooks: recording delivery %s failed", due.id, exc_info=True)
            return
        log.info(
            "webhook %s to %s: attempt %s %s (%s)",
            due.message_id,
            due.endpoint_id,
            due.attempt,
            outcome,
            answer.status or answer.error,
        )


# -- reads for surfaces -------------------------------------------------------------------------


def backlog() -> tuple[int, float]:
    """Pending deliveries of enabled endpoints and the oldest one's age in seconds (0 when
    none): the outbox backlog of ``/metrics``."""
    pending = WebhookDelivery.objects.filter(state="pending", endpoint__enabled=True)
    row = pending.aggregate(oldest=Min("created_at"))
    count = pending.count()
    oldest = row["oldest"]
    age = (timezone.now() - oldest).total_seconds() if oldest else 0.0
    return count, max(age, 0.0)


def endpoint_document(endpoint: WebhookEndpoint, *, secret: bool = False) -> dict[str, Any]:
    """An endpoint as the API and ``runtime_webhook --json`` show it; the secret only when
    asked (at creation, and to whoever may manage endpoints)."""
    document: dict[str, Any] = {
        "id": endpoint.id,
        "name": endpoint.name,
        "url": shown_url(endpoint.url),
        "events": list(endpoint.events),
        "enabled": endpoint.enabled,
        "created_by": endpoint.created_by,
        "created_at": endpoint.created_at.isoformat(),
    }
    if secret:
        document["secret"] = endpoint.secret
    return document


def shown_error(status: int | None, error: str, *, bodies: bool) -> str:
    """An attempt's error as shown: a response's body (an answer with a status) only when
    ``bodies`` (to whoever may manage endpoints: a receiver's answer can hold what an internal
    service says); an exception's text always."""
    return error if bodies or status is None or not error else BODY_HIDDEN


BODY_HIDDEN = "(the response body is shown to operators)"


def delivery_document(
    delivery: WebhookDelivery, *, attempts: bool = True, bodies: bool = True
) -> dict[str, Any]:
    """A delivery with its attempts (oldest first), as the API and the CLI show it; failed
    responses' bodies only when ``bodies`` (``shown_error``)."""
    document: dict[str, Any] = {
        "id": delivery.id,
        "endpoint_id": delivery.endpoint_id,
        "message_id": delivery.message_id,
        "kind": delivery.kind,
        "run_id": delivery.run_id,
        "seq": delivery.seq,
        "state": delivery.state,
        "attempts": delivery.attempts,
        "next_attempt_at": delivery.next_attempt_at.isoformat()
        if delivery.state == "pending"
        else None,
        "last_status": delivery.last_status,
        "last_error": shown_error(delivery.last_status, delivery.last_error, bodies=bodies),
        "created_at": delivery.created_at.isoformat(),
        "finished_at": delivery.finished_at.isoformat() if delivery.finished_at else None,
        "payload": delivery.payload,
    }
    if attempts:
        document["log"] = [
            {
                "number": a.number,
                "worker": a.worker,
                "started_at": a.started_at.isoformat(),
                "duration_ms": a.duration_ms,
                "status_code": a.status_code,
                "error": shown_error(a.status_code, a.error, bodies=bodies),
                "outcome": a.outcome,
            }
            for a in delivery.attempt_log.all()
        ]
    return document
