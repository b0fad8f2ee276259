"""Kinds that a host adds from outside the package: a model provider kind, a tool source.

A kind is found, in this order, in its setting (a mapping of kind to dotted path, e.g.
``RUNTIME_PROVIDERS = {"gemini": "myproject.models.GeminiProvider"}``), in the installed
packages' entry points of its group (``[project.entry-points."durable_agent_runtime.providers"]
gemini = "mypackage.models:GeminiProvider"``), then among the built-in defaults. Neither the
agent nor the provider package names the kinds they use: they ask ``load``.

An import that fails because an optional extra of this package is not installed says which
extra to install (``runtime.extras``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from runtime import extras


def paths(setting: str, group: str, defaults: Mapping[str, str]) -> dict[str, str]:
    """Every known kind of ``setting`` to where it is found: the built-in ``defaults``, then
    the entry points of ``group`` ("module:attr"), then the setting (later ones win).

    Raises ImproperlyConfigured naming ``setting`` when it is not a mapping of names to
    dotted paths."""
    found = dict(defaults)
    found.update(_entry_points(group))
    given = getattr(settings, setting, None) or {}
    if not isinstance(given, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in given.items()
    ):
        raise ImproperlyConfigured(
            f"{setting} must map kind names to dotted paths (e.g. {{'mykind':"
            f" 'myproject.module.Class'}}), got {given!r}"
        )
    found.update(given)
    return found


def load(setting: str, group: str, defaults: Mapping[str, str], kind: str) -> Any:
    """The object registered as ``kind`` (see ``paths``).

    Raises ImproperlyConfigured naming the kind, ``setting`` and the known kinds when none is
    registered, or naming the path (and the extra to install, when that is the cause) when it
    cannot be imported."""
    known = paths(setting, group, defaults)
    if kind not in known:
        raise ImproperlyConfigured(
            f"unknown kind {kind!r} for {setting}: the known kinds are"
            f" {', '.join(sorted(known))}. Add it to the {setting} setting as"
            f" {{{kind!r}: 'dotted.path.Class'}} or as an entry point of the group {group!r}"
        )
    return _import(setting, kind, known[kind])


@cache
def _entry_points(group: str) -> dict[str, str]:
    """The entry points of ``group``, read once a process: reading them scans every installed
    distribution's metadata (milliseconds), and a provider is looked up at every inference;
    a package installed later is seen by the processes started after it."""
    return {ep.name: ep.value for ep in entry_points(group=group)}


@cache
def _import(setting: str, kind: str, path: str) -> Any:
    try:
        return import_string(path.replace(":", "."))
    except ModuleNotFoundError as exc:
        extra = extras.extra_for(exc.name or "")
        if extra is not None:
            raise ImproperlyConfigured(
                f"{setting}: {kind!r} ({path}) needs the {extra!r} extra: {extras.hint(extra)}"
            ) from exc
        raise ImproperlyConfigured(
            f"{setting}: cannot import {kind!r} from {path!r}: {exc}"
        ) from exc
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"{setting}: cannot import {kind!r} from {path!r}: {exc}"
        ) from exc
