"""Fixtures for the provider tests: a loopback replay server and providers pointed at it.

Nothing here mocks an SDK: each test sends real HTTP from the official ``openai`` or
``anthropic`` client to a real server on 127.0.0.1 that replays recorded or synthetic bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from runtime.agents import ProviderConfig
from runtime.providers.anthropic_provider import AnthropicProvider
from runtime.providers.base import Delta, InferenceContext
from runtime.providers.openai_compat import OpenAIProvider
from tests.providers.replay import ReplayServer


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay
    assert replay.errors == [], "the replay server itself failed"


@pytest.fixture
def openai_provider(server: ReplayServer) -> Iterator[Callable[..., OpenAIProvider]]:
    """Return a factory: ``openai_provider(**ProviderConfig fields)`` against the server."""
    made: list[OpenAIProvider] = []

    def make(**config: Any) -> OpenAIProvider:
        config = {"model": "test-model", "timeout": 5.0, **config}
        provider = OpenAIProvider(
            ProviderConfig(kind="openai", base_url=f"{server.origin}/v1", **config)
        )
        made.append(provider)
        return provider

    yield make
    for provider in made:
        asyncio.run(provider.close())


@pytest.fixture
def anthropic_provider(server: ReplayServer) -> Iterator[Callable[..., AnthropicProvider]]:
    """Return a factory: ``anthropic_provider(**ProviderConfig fields)`` against the server."""
    made: list[AnthropicProvider] = []

    def make(**config: Any) -> AnthropicProvider:
        config = {"model": "test-model", "timeout": 5.0, **config}
        provider = AnthropicProvider(
            ProviderConfig(kind="anthropic", base_url=server.origin, **config)
        )
        made.append(provider)
        return provider

    yield make
    for provider in made:
        asyncio.run(provider.close())


@dataclass
class Recorder:
    """What an inference published: live Deltas and best-effort checkpoints."""

    deltas: list[Delta] = field(default_factory=list)
    checkpoints: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas if d.kind == "text")

    def calls(self) -> list[dict[str, Any]]:
        """Tool calls rebuilt from the Deltas alone, by index."""
        calls: dict[int, dict[str, Any]] = {}
        for d in self.deltas:
            if d.kind != "tool_call":
                continue
            if d.name is not None:
                assert d.index not in calls, f"call {d.index} announced twice"
                calls[d.index] = {"id": d.call_id, "name": d.name, "arguments": ""}
            else:
                assert d.index in calls, f"arguments for call {d.index} before its header"
                calls[d.index]["arguments"] += d.text
        return [calls[i] for i in sorted(calls)]


@pytest.fixture
def context() -> Callable[..., tuple[InferenceContext, Recorder]]:
    """Return a factory for an InferenceContext that records Deltas and checkpoints."""

    def make(
        *, step: int = 1, attempt: int = 1, resume_from: Any = None, **overrides: Any
    ) -> tuple[InferenceContext, Recorder]:
        recorder = Recorder()
        ctx = InferenceContext(
            run_id="run-1",
            step=step,
            attempt=attempt,
            metadata={},
            on_delta=recorder.deltas.append,
            checkpoint=lambda text, calls: recorder.checkpoints.append((text, list(calls))),
            resume_from=resume_from,
        )
        for key, value in overrides.items():
            setattr(ctx, key, value)
        return ctx, recorder

    return make
