"""What an operator gets wrong first: the key variable, the base URL, an unreachable server."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from runtime.agents import ProviderConfig
from runtime.domain.model import Message
from runtime.providers import keys
from runtime.providers.anthropic_provider import AnthropicProvider
from runtime.providers.base import InferenceRequest, ModelError
from runtime.providers.openai_compat import OpenAIProvider
from tests.providers.replay import Reply, infer, load_fixture

ASK = InferenceRequest(model="m", instructions="", messages=(Message(role="user", content="hi"),))


@pytest.fixture(autouse=True)
def fresh_warnings():
    keys._warned.clear()
    yield
    keys._warned.clear()


def test_an_unset_key_variable_warns_once(monkeypatch, caplog):
    monkeypatch.delenv("H13_MISSING_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="runtime.providers"):
        assert keys.api_key("H13_MISSING_KEY", "OPENAI_API_KEY", "openai") == keys.NO_KEY
        keys.api_key("H13_MISSING_KEY", "OPENAI_API_KEY", "openai")
    (record,) = caplog.records
    assert "H13_MISSING_KEY is not set" in record.getMessage()


def test_the_usual_variable_unset_is_fine_for_a_local_server(monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="runtime.providers"):
        assert keys.api_key(None, "OPENAI_API_KEY", "openai") == keys.NO_KEY
        assert keys.api_key("OPENAI_API_KEY", "OPENAI_API_KEY", "openai") == keys.NO_KEY
    assert caplog.records == []


def test_a_key_pasted_in_place_of_its_name_warns_without_echoing_it(caplog):
    with caplog.at_level(logging.WARNING, logger="runtime.providers"):
        assert keys.api_key("sk-proj-abc.def", "OPENAI_API_KEY", "openai") == keys.NO_KEY
    (record,) = caplog.records
    assert "not a variable name" in record.getMessage()
    assert "abc.def" not in record.getMessage()


def test_a_set_variable_is_the_key(monkeypatch):
    monkeypatch.setenv("H13_KEY", "sk-123")
    assert keys.api_key("H13_KEY", "OPENAI_API_KEY", "openai") == "sk-123"


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_the_anthropic_base_url_works_with_or_without_v1(suffix, server, context):
    server.queue(Reply.from_fixture(load_fixture("anthropic-stream-text.json")))
    config = ProviderConfig(
        kind="anthropic", model="m", base_url=f"{server.origin}{suffix}", timeout=5
    )
    provider = AnthropicProvider(config)
    ctx, _ = context()
    try:
        infer(provider, ASK, ctx)
    finally:
        asyncio.run(provider.close())
    (seen,) = server.seen
    assert seen.path == "/v1/messages"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_connection_error_names_the_url_tried(kind, context):
    port = _closed_port()
    url = f"http://127.0.0.1:{port}/v1" if kind == "openai" else f"http://127.0.0.1:{port}"
    config = ProviderConfig(kind=kind, model="m", base_url=url, timeout=2)
    provider = OpenAIProvider(config) if kind == "openai" else AnthropicProvider(config)
    ctx, _ = context()
    try:
        with pytest.raises(ModelError) as caught:
            infer(provider, ASK, ctx)
    finally:
        asyncio.run(provider.close())
    assert f"the connection failed (http://127.0.0.1:{port}" in caught.value.message
