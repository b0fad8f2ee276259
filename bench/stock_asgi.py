"""``console.asgi``'s application around Django's stock ASGI handler, for comparison.

    daphne bench.stock_asgi:application          # from the repository's root
    .venv/bin/python bench/serve_load.py --servers 2 --asgi bench.stock_asgi:application

The same router as ``console.asgi`` (``console.asgi.router``: ``/healthz`` on the event loop,
WebSockets through Channels, the channel layer made at start-up, ``console.oversized``) and
the same ``gc.freeze`` at the end, but HTTP goes through ``django.core.asgi.
get_asgi_application()``: the middleware chain built for async code, each sync middleware and
sync view handed between the event loop and a thread, a new thread per request. What
``bench/serve_load.py`` measures with it against ``console.asgi:application`` is what
``console.asgi.OneHopASGIHandler`` (an override of Django's private ``_middleware_chain``)
buys. Importing ``console.asgi`` also builds that module's own application, which is never
called here (its request threads start only with a first request).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

from console.asgi import freeze_startup, router  # noqa: E402

application = router(get_asgi_application())
freeze_startup()
