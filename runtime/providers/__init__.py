"""Model providers: the scripted one for tests and demos, OpenAI-compatible and Anthropic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.agents import ProviderConfig
    from runtime.providers.base import Provider


class Providers:
    """The model clients of one event loop: one network provider per agent configuration,
    shared by every run that the loop drives (a client holds a pool of HTTP connections bound
    to its loop), and a scripted provider per run. ``close()`` closes the clients."""

    def __init__(self) -> None:
        self.shared: dict[str, Provider] = {}

    def get(self, config: ProviderConfig, metadata: Mapping[str, Any]) -> Provider:
        """The provider for a run (see ``build_provider``, whose errors it raises)."""
        if "script" in metadata or config.kind == "scripted":
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
    """Return the provider for a run: its script when the run carries one, else the agent's.

    Raises ScriptRefused for a malformed script, ValueError for an unknown provider kind.
    """
    from runtime.providers.scripted import ScriptedProvider, parse_script

    if "script" in metadata:
        return ScriptedProvider(parse_script(metadata["script"]))
    if config.kind == "scripted":
        return ScriptedProvider(parse_script({"steps": []}))
    if config.kind == "openai":
        from runtime.providers.openai_compat import OpenAIProvider

        return OpenAIProvider(config)
    if config.kind == "anthropic":
        from runtime.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider(config)
    raise ValueError(f"unknown provider kind {config.kind!r}")
