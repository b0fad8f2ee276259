"""The optional extras of the package (pyproject.toml): which import needs which extra.

The core installs without them; a module that needs one imports it lazily, and a setting that
needs one is reported by a system check (``runtime.checks``) and by the error of the first use,
both saying ``pip install "durable-agent-runtime[<extra>]"``.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "durable-agent-runtime"  # pyproject.toml's [project] name

# A module of each extra's packages -> the extra that installs it (OpenTelemetry's API is in
# the core: spans cost nothing without the SDK).
MODULES = {
    "openai": "openai",
    "anthropic": "anthropic",
    "mcp": "mcp",
    "opentelemetry.sdk": "otel",
    "opentelemetry.exporter.otlp": "otel",
    "channels_redis": "redis",
    "redis": "redis",
}


def hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f'install it with pip install "{DISTRIBUTION}[{extra}]"'


def extra_for(module: str) -> str | None:
    """The extra whose packages provide ``module`` (a dotted name), or None."""
    for provided, extra in MODULES.items():
        if module == provided or module.startswith(provided + "."):
            return extra
    if module.startswith("opentelemetry.exporter"):
        return "otel"
    return None


def missing(extra: str) -> bool:
    """Whether a module of ``extra`` cannot be imported here."""
    return any(
        _absent(module)
        for module, needed_by in MODULES.items()
        if needed_by == extra and module != "redis"  # redis comes with channels_redis
    )


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True


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
