"""URLs under ``/api/v1/``: the API's operations, then a JSON 404 for any other path."""

from __future__ import annotations

from django.urls import URLPattern, path, re_path

from console.api.api import api
from console.api.errors import json_errors, not_found_view

_patterns, _app, _namespace = api.urls
for _pattern in _patterns:
    assert isinstance(_pattern, URLPattern)  # ninja lists plain paths, no nested includes
    _pattern.callback = json_errors(_pattern.callback)

urlpatterns = [
    path("", (_patterns, _app, _namespace)),
    re_path(r"^(?P<path>.*)$", not_found_view),
]
