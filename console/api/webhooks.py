"""``/webhooks``: outgoing webhook endpoints, their delivery log and the "send test" action.

Reading needs ``read``; creating, changing, deleting and testing endpoints need ``operate``
(an endpoint receives every subscribed event of every run). The secret is shown when an
endpoint is created or its secret rotated, and to ``operate`` on ``GET /webhooks/{id}``.
"""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.responses import Status

from console.api.auth import OPERATE, actor, operate_auth, read_auth, token_still_allows
from console.api.errors import errors
from console.api.pagination import CURSOR_PATTERN, keyset_page
from console.api.schemas import Id, StorableText
from runtime import webhooks
from runtime.models import WebhookDelivery, WebhookEndpoint

router = Router(tags=["webhooks"])

EventName = Literal["ticket.opened", "run.ended", "call.indeterminate", "run.paused"]


class EndpointIn(Schema):
    url: StorableText = Field(..., max_length=2000, description="http(s) URL that receives POSTs")
    events: list[EventName] = Field(..., min_length=1, description="the event kinds it receives")
    name: StorableText = Field("", max_length=100)
    secret: StorableText = Field(
        "", max_length=200, description="whsec_ base64 (at least 24 bytes); generated if empty"
    )


class EndpointPatch(Schema):
    url: StorableText | None = Field(None, max_length=2000)
    events: list[EventName] | None = Field(None, min_length=1)
    name: StorableText | None = Field(None, max_length=100)
    enabled: bool | None = None
    rotate_secret: bool = False


class EndpointOut(Schema):
    id: str
    name: str
    url: str
    events: list[str]
    enabled: bool
    created_by: str
    created_at: str
    secret: str | None = Field(None, description="only at creation, rotation, or to operate")


class EndpointListOut(Schema):
    items: list[EndpointOut]


class AttemptOut(Schema):
    number: int
    worker: str
    started_at: str
    duration_ms: int
    status_code: int | None
    error: str
    outcome: Literal["delivered", "retry", "failed"]


class DeliveryOut(Schema):
    id: int
    endpoint_id: str
    message_id: str = Field(..., description="the webhook-id header: the same on every attempt")
    kind: str
    run_id: str | None
    seq: int
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: str | None
    last_status: int | None
    last_error: str
    created_at: str
    finished_at: str | None
    payload: Any
    log: list[AttemptOut] = []


class DeliveryPageOut(Schema):
    items: list[DeliveryOut]
    next_cursor: str | None


class DeliveryFilters(Schema):
    state: Literal["pending", "delivered", "failed"] | None = None
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN, description="from next_cursor")
    limit: int = Field(50, ge=1, le=200)


def _may_operate(request: HttpRequest) -> bool:
    token_id = getattr(request, "api_token_id", None)
    return token_id is not None and token_still_allows(token_id, OPERATE)


@router.get(
    "",
    response={200: EndpointListOut, **errors(401, 403)},
    auth=read_auth,
    summary="List endpoints",
)
def list_endpoints(request: HttpRequest) -> dict[str, Any]:
    """Every webhook endpoint, oldest first (secrets are not listed)."""
    rows = WebhookEndpoint.objects.order_by("created_at", "id")
    return {"items": [webhooks.endpoint_document(e) for e in rows]}


@router.post(
    "",
    response={201: EndpointOut, **errors(400, 401, 403, 415, 422)},
    auth=operate_auth,
    summary="Create an endpoint",
)
def create_endpoint(request: HttpRequest, payload: EndpointIn) -> Status:
    """Create an enabled endpoint; 201 with its ``secret`` (keep it: receivers verify the
    ``webhook-signature`` with it). 422 ``webhook_refused`` for a URL that is not http(s), holds
    credentials, whitespace or control characters, or names an internal address (loopback,
    private, link-local, ...: README "Webhooks"), or a malformed secret; nothing is written."""
    endpoint = webhooks.create_endpoint(
        url=payload.url,
        events=payload.events,
        name=payload.name,
        secret=payload.secret,
        actor=actor(request),
    )
    return Status(201, webhooks.endpoint_document(endpoint, secret=True))


@router.get(
    "/{endpoint_id}",
    response={200: EndpointOut, **errors(401, 403, 404, 422)},
    auth=read_auth,
    summary="Read an endpoint",
)
def read_endpoint(request: HttpRequest, endpoint_id: Id) -> dict[str, Any]:
    """The endpoint; with its ``secret`` when the token may operate."""
    endpoint = webhooks.get_endpoint(endpoint_id)
    return webhooks.endpoint_document(endpoint, secret=_may_operate(request))


@router.patch(
    "/{endpoint_id}",
    response={200: EndpointOut, **errors(400, 401, 403, 404, 415, 422)},
    auth=operate_auth,
    summary="Change an endpoint",
)
def change_endpoint(request: HttpRequest, endpoint_id: Id, payload: EndpointPatch) -> dict:
    """Change the given fields (``enabled: false`` pauses its deliveries: they wait, and go
    when it is enabled again); ``rotate_secret`` issues a new secret, returned."""
    endpoint = webhooks.update_endpoint(
        endpoint_id,
        url=payload.url,
        events=payload.events,
        name=payload.name,
        enabled=payload.enabled,
        rotate_secret=payload.rotate_secret,
        actor=actor(request),
    )
    return webhooks.endpoint_document(endpoint, secret=payload.rotate_secret)


@router.delete(
    "/{endpoint_id}",
    response={204: None, **errors(401, 403, 404, 422)},
    auth=operate_auth,
    summary="Delete an endpoint",
)
def delete_endpoint(request: HttpRequest, endpoint_id: Id) -> Status:
    """Delete the endpoint with its deliveries and their log."""
    webhooks.delete_endpoint(endpoint_id, actor=actor(request))
    return Status(204, None)


@router.post(
    "/{endpoint_id}/test",
    response={202: DeliveryOut, **errors(401, 403, 404, 422)},
    auth=operate_auth,
    summary="Send a test event",
)
def test_endpoint(request: HttpRequest, endpoint_id: Id) -> Status:
    """Queue a signed ``webhook.test`` event for this endpoint (enabled or not); 202 its
    delivery, which a worker sends within ``RUNTIME_IDLE_POLL_SECONDS``: follow it in the
    delivery log."""
    delivery = webhooks.send_test(endpoint_id, actor=actor(request))
    return Status(202, webhooks.delivery_document(delivery))


@router.get(
    "/{endpoint_id}/deliveries",
    response={200: DeliveryPageOut, **errors(401, 403, 404, 422)},
    auth=read_auth,
    summary="An endpoint's delivery log",
)
def list_deliveries(
    request: HttpRequest, endpoint_id: Id, filters: Query[DeliveryFilters]
) -> dict[str, Any]:
    """The endpoint's deliveries, newest first, each with every attempt (status code, error,
    worker, duration); a failed response's body only to a token that may operate."""
    endpoint = webhooks.get_endpoint(endpoint_id)
    rows = WebhookDelivery.objects.filter(endpoint=endpoint).prefetch_related("attempt_log")
    if filters.state is not None:
        rows = rows.filter(state=filters.state)
    page, next_cursor = keyset_page(
        rows, cursor=filters.cursor, limit=filters.limit, newest_first=True
    )
    bodies = _may_operate(request)
    items = [webhooks.delivery_document(d, bodies=bodies) for d in page]
    return {"items": items, "next_cursor": next_cursor}
