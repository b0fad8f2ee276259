"""Model providers, found by kind: the scripted one for tests and demos, OpenAI-compatible and
Anthropic built in, any other by dotted path (``RUNTIME_PROVIDERS``) or entry point
(``durable_agent_runtime.providers``); see ``runtime.plugins``.

A provider kind is a callable taking the agent's ``ProviderConfig`` and returning a
``runtime.providers.base.Provider`` (usually the provider class itself). One whose attribute
``shared`` is false is made per run (the scripted one); any other is made once per agent
configuration and event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runtime import plugins

if TYPE_CHECKING:
    from runtime.agents import ProviderConfig
    from runtime.providers.base import Provider

SETTING = "RUNTIME_PROVIDERS"
ENTRY_POINTS = "durable_agent_runtime.providers"
BUILT_IN = {
    "scripted": "runtime.providers.scripted.from_config",
    "openai": "runtime.providers.openai_compat.OpenAIProvider",
    "anthropic": "runtime.providers.anthropic_provider.AnthropicProvider",
}


def factory(kind: str) -> Any:
    """The callable registered as provider ``kind``; raises ImproperlyConfigured naming
    RUNTIME_PROVIDERS (an unknown kind, an import that fails, a missing extra)."""
    return plugins.load(SETTING, ENTRY_POINTS, BUILT_IN, kind)


def kinds() -> dict[str, str]:
    """Every known provider kind and its dotted path (``runtime.plugins.paths``)."""
    return plugins.paths(SETTING, ENTRY_POINTS, BUILT_IN)


class Providers:
    """The model clients of one event loop: one network provider per agent configuration,
    shared by every run that the loop drives (a client holds a pool of HTTP connections bound
    to its loop), and a per-run provider (a script, or a kind that is not ``shared``) per run.
    ``close()`` closes the clients."""

    def __init__(self) -> None:
        self.shared: dict[str, Provider] = {}

    def get(self, config: ProviderConfig, metadata: Mapping[str, Any]) -> Provider:
        """The provider for a run (see ``build_provider``, whose errors it raises)."""
        if "script" in metadata or not getattr(factory(config.kind), "shared", True):
            return build_provider(config, metadata)
        key = repr(config)
        if key not in self.shared:
            self.shared[key] = build_provider(config, metadata)
        return self.shared[key]

    async def close(self) -> None:
        shared, self.shared = list(self.shared.values()), {}
        for provider in shared:
            close = getattr(provider, "close", None)
            if close is not None:
                await close()


def build_provider(config: ProviderConfig, metadata: Mapping[str, Any]) -> Provider:
    """Return the provider for a run: its script when the run carries one, else the one the
    agent's kind names.

    Raises ScriptRefused for a malformed script, ImproperlyConfigured (naming
    RUNTIME_PROVIDERS) for an unknown kind or one that cannot be imported.
    """
    if "script" in metadata:
        from runtime.providers.scripted import ScriptedProvider, parse_script

        return ScriptedProvider(parse_script(metadata["script"]))
    provider: Provider = factory(config.kind)(config)
    return provider
