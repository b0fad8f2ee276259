"""Test agents for many runs in flight: the demo's ledger tools with an OpenAI-compatible
model at ``RUNTIME_TEST_MODEL_URL`` (tests/model_server.py), and an ``async def`` tool beside a
``def`` one (loaded by worker subprocesses through RUNTIME_AGENTS)."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import replace
from typing import Any

from runtime.agents import Agent, ProviderConfig
from runtime.demo.agent import demo
from runtime.domain.model import RecoveryPolicy
from runtime.tools import ToolContext, tool

AGENTS = ",".join(
    (
        "runtime.demo.agent.demo",
        "tests.runtime.inflight_agent.inflight",
        "tests.runtime.inflight_agent.mixed",
    )
)


def inflight() -> Agent:
    """The demo's tools, asking the model server named by RUNTIME_TEST_MODEL_URL."""
    url = os.environ.get("RUNTIME_TEST_MODEL_URL", "http://127.0.0.1:9/v1")
    return replace(
        demo,
        name="inflight",
        provider=ProviderConfig(kind="openai", model="m", base_url=url, timeout=120),
    )


@tool(policy=RecoveryPolicy.REPLAY)
async def where_async(ctx: ToolContext, key: str) -> dict[str, Any]:
    """Say which thread ran this ``async def`` tool, after a pause that holds no thread."""
    await asyncio.sleep(0.01)
    return {
        "key": key,
        "thread": threading.current_thread().name,
        "owner": await ctx.astill_owner(),
    }


@tool(policy=RecoveryPolicy.REPLAY)
def where_sync(ctx: ToolContext, key: str) -> dict[str, Any]:
    """Say which thread ran this ``def`` tool."""
    return {"key": key, "thread": threading.current_thread().name, "owner": ctx.still_owner()}


mixed = replace(demo, name="mixed", tools=(where_async, where_sync))
