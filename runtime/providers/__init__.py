"""Model providers: the scripted one for tests and demos, OpenAI-compatible and Anthropic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.agents import ProviderConfig
    from runtime.providers.base import Provider


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
