"""API keys and base URLs of the model providers, read the way an operator configures them.

``ProviderConfig.api_key_env`` names the variable that holds the key (never the key itself).
A name other than the provider's usual one (OPENAI_API_KEY, ANTHROPIC_API_KEY) that is unset
is almost always a mistake (the variable was not exported, or the key was pasted where its
name belongs), so it is logged as a warning, once per process and name.
"""

from __future__ import annotations

import logging
import os
import re
import threading

log = logging.getLogger("runtime.providers")

NO_KEY = "not-needed"  # local servers take any key; the SDKs insist on one
# What a pasted key looks like, as opposed to a variable name (letters, digits, underscores).
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_warned: set[str] = set()
_lock = threading.Lock()


def api_key(env_name: str | None, default_env: str, provider: str) -> str:
    """The key in the variable ``env_name`` (``default_env`` when None), or NO_KEY.

    Warns (once per name) when a name other than ``default_env`` is unset or empty, or when
    the "name" is not a variable name at all (a key pasted in its place).
    """
    name = env_name or default_env
    if not VARIABLE_NAME.fullmatch(name):
        _warn_once(
            name,
            "%s: the API key variable name %r is not a variable name; set it to the NAME of "
            "the variable that holds the key (e.g. RUNTIME_MODEL_API_KEY_ENV=MY_KEY), not the "
            "key; sending no key",
            provider,
            f"{name[:4]}...",
        )
        return NO_KEY
    value = os.environ.get(name, "")
    if not value and name != default_env:
        _warn_once(
            name,
            "%s: the API key variable %s is not set (or empty); sending no key. Export it, "
            "or point the key variable setting at the variable that holds the key",
            provider,
            name,
        )
    return value or NO_KEY


def _warn_once(name: str, message: str, *args: object) -> None:
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    log.warning(message, *args)


def anthropic_base_url(url: str | None) -> str | None:
    """The Anthropic SDK appends ``/v1/messages`` itself: accept a base URL written with or
    without a trailing ``/v1`` (``https://api.anthropic.com`` and ``.../v1`` both work)."""
    if url is None:
        return None
    trimmed = url.rstrip("/")
    return trimmed[: -len("/v1")] if trimmed.endswith("/v1") else trimmed
