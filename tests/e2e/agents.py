"""The agent of the end-to-end test: a calculator on the OpenAI-compatible provider.

It is built to make the same requests as the recorded conversation in
``tests/fixtures/wire/openai-stream-single-tool.json`` (first turn: the model calls
``multiply(a=1231, b=2331)``) and ``openai-stream-text.json`` (second turn: the final answer):
model ``gpt-4o-mini``, one tool ``multiply`` whose name, description and JSON schema are the
recording's, and no instructions, because the provider sends instructions as a ``system``
message and the recording has none.

``multiply`` is approval-gated (permission ASK) and replay-safe (policy REPLAY, keyed by its
operation id): every execution is recorded in the demo effect ledger (``demo_ledger --json``),
so "executed once" is countable.

Configuration: ``RUNTIME_CALCULATOR_BASE_URL`` (the OpenAI-compatible server, e.g. the test's
loopback replay server ``http://127.0.0.1:PORT/v1``); the key, if the server wants one, comes
from ``OPENAI_API_KEY``. Register with ``RUNTIME_AGENTS=...,tests.e2e.agents.calculator``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict

from runtime.agents import Agent, ProviderConfig
from runtime.demo.agent import _apply
from runtime.domain.model import Permission, RecoveryPolicy
from runtime.tools import Tool, ToolContext

MODEL = "gpt-4o-mini"


def _recorded_schema(schema: dict[str, Any]) -> None:
    """Shape pydantic's schema like the recording's: no titles, no additionalProperties key
    (validation still refuses extra arguments)."""
    schema.pop("additionalProperties", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)


class MultiplyArguments(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_recorded_schema)

    a: int
    b: int


def _multiply(ctx: ToolContext, a: int, b: int) -> str:
    _apply(ctx, f"{a}*{b}", "multiply")  # one ledger row per operation id, repeats counted
    return str(a * b)


multiply = Tool(
    name="multiply",
    description="Multiply two numbers.",
    fn=_multiply,
    arguments_model=MultiplyArguments,
    policy=RecoveryPolicy.REPLAY,
    permission=Permission.ASK,
    max_attempts=3,
)


def calculator() -> Agent:
    """The agent, read from the environment when the registry loads it."""
    return Agent(
        name="calculator",
        description="Multiplies on an OpenAI-compatible model; every multiplication is approved.",
        instructions="",
        tools=(multiply,),
        provider=ProviderConfig(
            kind="openai",
            model=MODEL,
            base_url=os.environ.get("RUNTIME_CALCULATOR_BASE_URL", "http://127.0.0.1:11434/v1"),
            timeout=30.0,
        ),
        step_limit=4,
    )
