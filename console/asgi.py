"""ASGI entry point: HTTP through Django, WebSockets through Channels.

WebSockets pass the allowed-hosts origin check and Django's session authentication; the
consumers then refuse anyone without the read permission.

HTTP requests go through ``OneHopASGIHandler``: Django's ASGI handler with the middleware
chain built for sync code and entered once, on one of the process's request threads. Django's
own handler builds it for async code, and then every middleware written as
``process_request`` / ``process_response`` (Django's, WhiteNoise's, django-prometheus's) and
every sync view is handed between the event loop and the request's thread, about 16 round
trips per request (WhiteNoise, which is sync only, turns the top of the chain back to sync as
well). Each trip waits for the loop and for a thread to be scheduled, so on a busy machine
they, not the work, made ``GET /runs`` slow (issue 12, item 8). Async views (the event stream)
still run on the event loop: Django calls them from the sync chain with ``async_to_sync``,
and a streamed body is sent by the handler on the loop, as before.

Django gives each request a new thread of its own. When 70 clients connect at once, 35
threads of one process then take turns at the interpreter's lock at every database round
trip, and each request took 100 to 350 ms of work worth 5. Here the chains run on a fixed set
of ``RUNTIME_REQUEST_THREADS`` threads (default 8, no more than the connection pool lends)
and the other requests wait their turn in order. A request thread gives its database
connections back when its chain returns, as Django does when a request finishes.

The channel layer is made here, at start-up: made by the first stream, it imported its
backend (channels_redis, redis: about a third of a second) on the event loop, while 50
streams and 20 pollers that had just connected waited. Last, what start-up made (Django,
the URL map, the API's schemas: some 150,000 objects that live as long as the process) is
moved out of the garbage collector's sight (``gc.freeze``): every full collection walked it
again, and under load each one stopped the process for a tenth of a second or more.
"""

import gc
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler whose middleware chain and sync views run in one hand-over to
    one of ``settings.RUNTIME_REQUEST_THREADS`` request threads and back."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        chain = self._middleware_chain  # type: ignore[has-type]  # set by load_middleware
        from runtime import conf  # after django.setup(), which this module's import ends in

        threads = ThreadPoolExecutor(conf.request_threads(), "request")

        def respond(request: HttpRequest) -> HttpResponseBase:
            try:
                return chain(request)
            finally:
                # Django's request_finished closes the connections of the thread that sends
                # it, which is not this one: give this thread's back (closed, or to the pool).
                close_old_connections()

        # What ASGIHandler awaits: the sync chain, entered once on a request thread.
        self._middleware_chain = sync_to_async(respond, thread_sensitive=False, executor=threads)


def django_application() -> OneHopASGIHandler:
    """What ``django.core.asgi.get_asgi_application`` returns, with the one-hop chain."""
    import django

    django.setup(set_prefix=False)
    return OneHopASGIHandler()


django_asgi_app = django_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.layers import get_channel_layer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import reverse  # noqa: E402

from console import health, oversized  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

get_channel_layer()  # made (and its backend imported) now, not by the first stream
# daphne makes its HTTP factory after it imported this module, whichever command started it
# (runtime_serve, the Procfile's daphne): a head too large to read is answered 414 / 431.
oversized.install()


# The console's liveness URL wherever the URL map mounts it (``/healthz`` here): reversed
# once, at start-up, and answered on the event loop.
HEALTHZ_PATH = reverse("console:healthz")


async def http_application(scope: dict, receive: Any, send: Any) -> None:
    """``HEALTHZ_PATH`` on the event loop (console.health says why); the rest through Django."""
    if scope["path"] == HEALTHZ_PATH:
        await health.healthz(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

# What start-up made lives as long as the process: collect start-up's garbage once, then keep
# the rest out of every later collection (the Python docs' use of gc.freeze).
gc.collect()
gc.freeze()
