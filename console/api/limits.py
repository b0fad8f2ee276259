"""``/limits``: each limit on what runs at once and its use now (runtime.limits)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema

from console.api.auth import read_auth
from console.api.errors import errors
from runtime import limits

router = Router(tags=["limits"])


class RunLimitOut(Schema):
    agent: str
    runs: int | None = Field(None, description="runs of the agent driven at once, at most")
    running: int = Field(description="runs of the agent a worker holds a live lease of now")
    waiting: int = Field(description="Running runs of the agent no worker holds now")
    key: str | None = Field(None, description="the metadata field of the concurrency key")
    per_key: int | None = Field(None, description="runs with one key value at once, at most")
    busiest_key: str | None = Field(None, description="the key value with the most running")
    busiest_running: int | None = None


class ModelLimitOut(Schema):
    model: str
    concurrency: int | None = Field(None, description="inferences at once, at most")
    in_flight: int = Field(description="inferences under way now (live claims only)")
    per_minute: float | None = Field(None, description="requests a minute, at most")
    tokens: float | None = Field(None, description="requests the bucket allows at once now")
    not_before: datetime | None = Field(
        None, description="no request before this instant (a provider's Retry-After)"
    )
    waiting: int = Field(description="runs released to wait for this model's budget")


class LimitsOut(Schema):
    runs: list[RunLimitOut]
    models: list[ModelLimitOut]


@router.get(
    "",
    response={200: LimitsOut, **errors(401, 403)},
    auth=read_auth,
    summary="Each limit on what runs at once, and its use now",
)
def list_limits(request: HttpRequest) -> dict[str, Any]:
    """Run limits by agent (RUNTIME_RUN_LIMITS and agents' declarations) and model limits
    (RUNTIME_MODEL_LIMITS), each with its use now, read from the database (so every
    worker's runs count)."""
    return limits.usage()
