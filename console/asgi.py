"""ASGI entry point: HTTP through Django, WebSockets through Channels.

WebSockets pass the allowed-hosts origin check and Django's session authentication; the
consumers then refuse anyone without the read permission.

HTTP requests go through ``OneHopASGIHandler``: Django's ASGI handler with the middleware
chain built for sync code and entered once, on the request's thread. Django's own handler
builds it for async code, and then every middleware written as ``process_request`` /
``process_response`` (Django's, WhiteNoise's, django-prometheus's) and every sync view is
handed between the event loop and the request's thread, about 16 round trips per request
(WhiteNoise, which is sync only, turns the top of the chain back to sync as well). Each
trip waits for the loop and for a thread to be scheduled, so on a busy machine they, not
the work, made ``GET /runs`` slow (issue 12, item 8). Async views (the event stream) still
run on the event loop: Django calls them from the sync chain with ``async_to_sync``, and a
streamed body is sent by the handler on the loop, as before.

The channel layer is made here, at start-up: made by the first stream, it imported its
backend (channels_redis, redis: about a third of a second) on the event loop, while 50
streams and 20 pollers that had just connected waited. Last, what start-up made (Django,
the URL map, the API's schemas: some 150,000 objects that live as long as the process) is
moved out of the garbage collector's sight (``gc.freeze``): every full collection walked it
again, and under load each one stopped the process for a tenth of a second or more.
"""

import gc
import os

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


class OneHopASGIHandler(ASGIHandler):
    """Django's ASGI handler whose middleware chain and sync views run in one hand-over to
    the request's thread (thread-sensitive, as Django runs sync views) and back."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        # What ASGIHandler awaits: the sync chain, entered once on the request's thread.
        chain = self._middleware_chain  # type: ignore[has-type]  # set by load_middleware
        self._middleware_chain = sync_to_async(chain, thread_sensitive=True)


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

from console.routing import websocket_urlpatterns  # noqa: E402

get_channel_layer()  # made (and its backend imported) now, not by the first stream

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

# What start-up made lives as long as the process: collect start-up's garbage once, then keep
# the rest out of every later collection (the Python docs' use of gc.freeze).
gc.collect()
gc.freeze()
