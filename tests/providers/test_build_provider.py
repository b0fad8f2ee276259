"""``build_provider``: a run's script wins; otherwise the agent's ProviderConfig decides."""

from __future__ import annotations

import asyncio

import pytest
from django.core.exceptions import ImproperlyConfigured

from runtime.agents import ProviderConfig
from runtime.domain.model import Message
from runtime.errors import ScriptRefused
from runtime.providers import build_provider
from runtime.providers.anthropic_provider import AnthropicProvider
from runtime.providers.base import InferenceContext, InferenceRequest
from runtime.providers.openai_compat import OpenAIProvider
from runtime.providers.scripted import FINAL_TEXT, ScriptedProvider
from tests.providers.replay import infer

ASK = InferenceRequest(model="m", instructions="", messages=(Message(role="user", content="hi"),))


def ctx() -> InferenceContext:
    return InferenceContext(run_id="r", step=1, attempt=1, metadata={}, on_delta=lambda d: None)


def test_a_script_in_the_metadata_wins_over_any_kind() -> None:
    config = ProviderConfig(kind="openai", model="gpt", base_url="http://127.0.0.1:9/v1")
    provider = build_provider(config, {"script": {"steps": [{"text": "scripted answer"}]}})
    assert isinstance(provider, ScriptedProvider)
    assert infer(provider, ASK, ctx()).text == "scripted answer"


def test_scripted_without_a_script_has_nothing_more_to_say() -> None:
    provider = build_provider(ProviderConfig(kind="scripted"), {})
    assert isinstance(provider, ScriptedProvider)
    assert infer(provider, ASK, ctx()).text == FINAL_TEXT


def test_openai_kind() -> None:
    config = ProviderConfig(kind="openai", model="llama3.1", base_url="http://127.0.0.1:11434/v1")
    provider = build_provider(config, {})
    assert isinstance(provider, OpenAIProvider)
    assert str(provider.client.base_url) == "http://127.0.0.1:11434/v1/"
    assert provider.client.max_retries == 0
    asyncio.run(provider.close())


def test_anthropic_kind() -> None:
    config = ProviderConfig(
        kind="anthropic", model="claude", base_url="http://127.0.0.1:9", timeout=12
    )
    provider = build_provider(config, {})
    assert isinstance(provider, AnthropicProvider)
    assert provider.client.max_retries == 0
    assert provider.client.timeout == 12
    asyncio.run(provider.close())


def test_unknown_kind() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown kind 'gemini' for RUNTIME_PROVIDERS"):
        build_provider(ProviderConfig(kind="gemini"), {})


def test_malformed_script() -> None:
    with pytest.raises(ScriptRefused):
        build_provider(ProviderConfig(kind="scripted"), {"script": {"steps": [{"nonsense": 1}]}})
