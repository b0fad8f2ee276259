"""The optional extras of the package (pyproject.toml): which import needs which extra.

The core installs without them; a module that needs one imports it lazily, and a setting that
needs one is reported by a system check (``runtime.checks``) and by the error of the first use,
both saying ``pip install "durable-agent-runtime[<extra>]"``.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "durable-agent-runtime"  # pyproject.toml's [project] name

# The top-level module of each extra's packages -> the extra that installs it.
MODULES = {
    "openai": "openai",
    "anthropic": "anthropic",
    "mcp": "mcp",
    "opentelemetry": "otel",
    "channels_redis": "redis",
    "redis": "redis",
}


def hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f'install it with pip install "{DISTRIBUTION}[{extra}]"'


def extra_for(module: str) -> str | None:
    """The extra whose packages provide ``module`` (a dotted name), or None."""
    return MODULES.get(module.split(".")[0])


def missing(extra: str) -> bool:
    """Whether a module of ``extra`` cannot be imported here."""
    return any(
        importlib.util.find_spec(module) is None
        for module, needed_by in MODULES.items()
        if needed_by == extra and module != "redis"  # redis comes with channels_redis
    )


class ExtraMissing(ImportError):
    """An optional extra is needed and not installed; the message names the command."""

    def __init__(self, extra: str, needed_for: str) -> None:
        super().__init__(f"{needed_for} needs the {extra!r} extra: {hint(extra)}")
        self.extra = extra


def require(extra: str, needed_for: str) -> None:
    """Raise ExtraMissing (an ImportError naming ``extra`` and ``needed_for``) unless
    ``extra`` is installed."""
    if missing(extra):
        raise ExtraMissing(extra, needed_for)
