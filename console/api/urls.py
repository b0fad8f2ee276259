"""URLs of the API (``/api/v1/`` in this repository's project, wherever a host includes
them): the API's operations under the ``api_v1`` namespace, then a JSON 404 for any other
path. The API is part of the console app (its tokens and permissions are console models):
``console`` must be in INSTALLED_APPS for it, even when a host mounts only these URLs.
"""

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
