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

The handler replaces the chain that Django's ``load_middleware`` stores in the private
``_middleware_chain`` (what ``get_response_async`` awaits). A Django release that builds or
calls the chain differently would make the override silently do nothing, so
``tests/api/test_serving.py`` serves a request through the handler and fails unless a
middleware and a sync view ran on one request thread with no hand-over between them.
``bench/stock_asgi.py`` is the same application around Django's stock handler (``router``
takes either), for ``bench/serve_load.py --asgi`` to measure what the override buys.

The channel layer is made here, at start-up: made by the first stream, it imported its
backend (channels_redis, redis: about a third of a second) on the event loop, while 50
streams and 20 pollers that had just connected waited. Last, what start-up made (Django,
the URL map, the API's schemas: some 150,000 objects that live as long as the process) is
moved out of the garbage collector's sight (``gc.freeze``): every full collection walked it
again, and under load each one stopped the process for a tenth of a second or more.
"""

import gc
import os
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.exceptions import BadRequest
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponseBase

if TYPE_CHECKING:
    from channels.routing import ProtocolTypeRouter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

# An ASGI 3 application: ``await app(scope, receive, send)``.
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


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

    def create_request(
        self, scope: Mapping[str, Any], body_file: Any
    ) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        """Django's ``(request, None)`` for ``scope``, or its ``(None, response)`` for one it
        refuses; and ``(None, 400)`` for a Content-Type Django cannot parse (an RFC 2231
        parameter in a charset that does not exist, ``boundary*=x''%ff``): Django raises
        BadRequest here, where nothing catches it, and the client got daphne's 500 page. The
        400 is ``console.api.errors.malformed_request``: the API's error shape under the API's
        prefix."""
        from console.api.errors import malformed_request

        try:
            return super().create_request(scope, body_file)
        except BadRequest:
            return None, malformed_request(str(scope.get("path", "")))


def django_application() -> OneHopASGIHandler:
    """What ``django.core.asgi.get_asgi_application`` returns, with the one-hop chain."""
    import django

    django.setup(set_prefix=False)
    return OneHopASGIHandler()


def router(django_app: ASGIApp) -> "ProtocolTypeRouter":
    """The console's ASGI application around ``django_app``, the ASGI application Django's
    HTTP requests go through (``django_application()`` here, Django's stock handler in
    ``bench/stock_asgi.py``): the console's liveness URL (``console:healthz``, ``/healthz``
    here) answered on the event loop, other HTTP requests through ``django_app``, WebSockets
    through Channels. Call it after ``django.setup()``. It also makes the channel layer and
    installs ``console.oversized`` (the start-up work the module's docstring describes)."""
    from channels.auth import AuthMiddlewareStack
    from channels.layers import get_channel_layer
    from channels.routing import ProtocolTypeRouter, URLRouter
    from channels.security.websocket import AllowedHostsOriginValidator
    from django.urls import reverse

    from console import health, oversized
    from console.routing import websocket_urlpatterns

    get_channel_layer()  # made (and its backend imported) now, not by the first stream
    # daphne makes its HTTP factory after it imported this module, whichever command started
    # it (runtime_serve, the Procfile's daphne): a head too large to read is answered 414 / 431.
    oversized.install()
    # The console's liveness URL wherever the URL map mounts it (``/healthz`` here): reversed
    # once, at start-up, and answered on the event loop.
    healthz_path = reverse("console:healthz")

    async def http_application(scope: dict, receive: Any, send: Any) -> None:
        """The liveness URL on the event loop (console.health says why); the rest through
        Django."""
        if scope["path"] == healthz_path:
            await health.healthz(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return ProtocolTypeRouter(
        {
            "http": http_application,
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
            ),
        }
    )


def freeze_startup() -> None:
    """Keep what start-up made out of every later garbage collection: it lives as long as the
    process. Start-up's garbage is collected once first (the Python docs' use of
    ``gc.freeze``)."""
    gc.collect()
    gc.freeze()


application = router(django_application())
freeze_startup()
