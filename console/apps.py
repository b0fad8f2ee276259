from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    # The one "console" in INSTALLED_APPS picks (this module holds DaphneConfig too).
    default = True
    name = "console"
    verbose_name = "Operator console"

    def ready(self) -> None:
        from console import checks  # noqa: F401  (registers what a host needs: console.E001-3)


class DaphneConfig(AppConfig):
    """daphne's app (its ``runserver``, which serves WebSockets too), without daphne's own
    AppConfig: that module imports ``daphne.server``, i.e. Twisted and its asyncio reactor, in
    every process at start-up (~0.3 s of CPU), workers and CLI commands included, which never
    serve. The processes that serve import ``daphne.server`` before anything else of Twisted
    (``runserver``, ``runtime_serve`` and ``python -m daphne`` all do at import), which is all
    that early import guarded. daphne's check that it is listed before staticfiles is not
    registered (it looks for its own AppConfig class); settings keeps that order.
    """

    name = "daphne"
    verbose_name = "Daphne"
