"""The operator console: server-rendered pages with htmx partials (see ``urls.py``)."""
