"""Where the API is mounted in the URL map, for the handlers that answer in the API's error
shape under it (400, 404, 503) and Django's page elsewhere. No path is written by hand: a
host includes ``console.api.urls`` under any prefix.
"""

from __future__ import annotations

from django.urls import NoReverseMatch, reverse


def prefix() -> str | None:
    """The path the API is mounted at (its root, ``reverse("api_v1:api-root")``, e.g.
    "/api/v1/"), or None where the URL map does not include the API (Django caches the
    reversal)."""
    try:
        return reverse("api_v1:api-root")
    except NoReverseMatch:
        return None


def is_api_path(path: str) -> bool:
    """Whether ``path`` is under the API's prefix (its errors then take the API's shape)."""
    root = prefix()
    return root is not None and path.startswith(root)


def docs_url() -> str | None:
    """The path of the API's interactive docs (``api_v1:openapi-view``), or None."""
    try:
        return reverse("api_v1:openapi-view")
    except NoReverseMatch:
        return None
