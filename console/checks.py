"""System checks of the console app: what a host project needs for the operator console, named
before a page fails (README, Configuration: "What each app needs").

The API (``console.api.urls``) is part of the same app (its tokens are the console's model) and
needs none of the UI's: the checks of templates and middleware apply only where the UI's URLs
(``console.views.urls``, application namespace ``console``) are mounted.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks

# The apps the console needs installed, and why.
APPS = {
    "runtime": "the engine whose runs, tickets and log it shows",
    "django.contrib.auth": "sign-in and the permissions of viewers, approvers and operators",
    "django.contrib.contenttypes": "the permissions (django.contrib.auth needs it)",
    "django.contrib.sessions": "sign-in (the console's pages and the API's session callers)",
}
# What the UI's pages need besides (only where its URLs are mounted).
UI_APPS = {
    "django.contrib.messages": "the notices shown after an action",
    "django.contrib.staticfiles": "its stylesheet and scripts (found and collected)",
    "django_htmx": "the template tags of its pages",
}
UI_MIDDLEWARE = {
    "django.contrib.sessions.middleware.SessionMiddleware": "sign-in",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "request.user",
    "django.contrib.messages.middleware.MessageMiddleware": "the notices after an action",
    "django_htmx.middleware.HtmxMiddleware": "request.htmx, which its views read",
}
UI_CONTEXT_PROCESSORS = {
    "django.template.context_processors.request": "its pages read the request",
    "django.contrib.auth.context_processors.auth": "its pages show what the user may do",
    "django.contrib.messages.context_processors.messages": "the notices after an action",
}
NAMESPACE = "console"  # console.views.urls' app_name


def _ui_mounted() -> bool:
    """Whether the ROOT_URLCONF includes the console's pages (their application namespace)."""
    from django.urls import get_resolver

    if not getattr(settings, "ROOT_URLCONF", None):
        return False
    try:
        return NAMESPACE in get_resolver().app_dict
    except Exception:  # a broken URLconf: Django's own URL checks report it
        return False


def _missing_apps(needed: dict[str, str]) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            f"the console needs {name!r} in INSTALLED_APPS: {why}",
            hint=f'add "{name}" to INSTALLED_APPS',
            id="console.E001",
        )
        for name, why in needed.items()
        if not apps.is_installed(name)
    ]


@checks.register()
def console_needs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """console.E001: an app the console needs is not installed (APPS; UI_APPS where its pages
    are mounted). console.E002: a middleware its pages need is missing. console.E003: the
    Django template backend lacks a context processor its pages read."""
    errors = _missing_apps(APPS)
    if not _ui_mounted():
        return errors
    errors += _missing_apps(UI_APPS)
    middleware = list(getattr(settings, "MIDDLEWARE", []))
    errors += [
        checks.Error(
            f"the console's pages need {name!r} in MIDDLEWARE: {why}",
            hint=f'add "{name}" to MIDDLEWARE',
            id="console.E002",
        )
        for name, why in UI_MIDDLEWARE.items()
        if name not in middleware
    ]
    engines = [
        t
        for t in getattr(settings, "TEMPLATES", [])
        if t.get("BACKEND") == "django.template.backends.django.DjangoTemplates"
    ]
    processors = {p for t in engines for p in t.get("OPTIONS", {}).get("context_processors", [])}
    errors += [
        checks.Error(
            f"the console's pages need the context processor {name!r}: {why}",
            hint="add it to TEMPLATES[...]['OPTIONS']['context_processors'] of the"
            " DjangoTemplates backend",
            id="console.E003",
        )
        for name, why in UI_CONTEXT_PROCESSORS.items()
        if name not in processors
    ]
    return errors
