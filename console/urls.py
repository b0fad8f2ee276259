from django.contrib import admin
from django.urls import include, path

from console import health

handler400 = "console.api.errors.bad_request_view"  # the API's error shape under /api/
handler500 = "console.unavailable.server_error"  # a database fault is a 503, not a 500

urlpatterns = [
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("console.api.urls")),
    path("", include("console.views.urls")),
]
