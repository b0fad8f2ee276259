"""The demo agent: tools that write to an effect ledger keyed by operation id, one per
recovery policy, plus an approval-gated one, an input-asking one and a slow one, so that
"executed twice" is countable (``manage.py demo_ledger --json``)."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from runtime import conf, db
from runtime.agents import Agent, ProviderConfig
from runtime.demo.models import LedgerEffect
from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.mcp.config import parse_servers
from runtime.tools import Fenced, InputWait, Tool, ToolContext, delegate, tool

Key = Annotated[str, Field(min_length=1, max_length=200, description="what to record")]


def _apply(ctx: ToolContext, key: str, tool_name: str) -> dict[str, Any]:
    """Record the effect once per operation id; count every repeated application.

    One fenced upsert: it lands only while this worker's claim owns the run, and the run's row
    stays locked while it runs, so a worker paused mid-effect cannot apply it beside the worker
    that took its run over (ToolContext.fence_sql). Raises Fenced when the claim is gone.
    """
    connection = db.connection
    table = connection.ops.quote_name(LedgerEffect._meta.db_table)
    fence, params = ctx.fence_sql()
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH fence AS ({fence}) "
            f"INSERT INTO {table} (operation_id, key, tool, run_id, applied, created_at) "
            "SELECT %s, %s, %s, %s, 1, %s FROM fence WHERE true "
            f"ON CONFLICT (operation_id) DO UPDATE SET applied = {table}.applied + 1 "
            "RETURNING operation_id",
            [*params, ctx.operation_id, key, tool_name, ctx.run_id, timezone.now()],
        )
        if cursor.fetchone() is None:
            raise Fenced(f"run {ctx.run_id} is no longer owned by lease {ctx.lease_epoch}")
    return {"recorded": key, "operation_id": ctx.operation_id}


def _lookup(ctx: ToolContext) -> dict[str, Any] | None:
    row = LedgerEffect.objects.filter(operation_id=ctx.operation_id).first()
    return {"recorded": row.key, "operation_id": row.operation_id} if row else None


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=3, effects=Effects.IDEMPOTENT)
def ledger_replay(ctx: ToolContext, key: Key) -> dict[str, Any]:
    """Record a key in the ledger. Idempotent: safe to replay with the same operation id."""
    return _apply(ctx, key, "ledger_replay")


@tool(policy=RecoveryPolicy.RECONNECT, max_attempts=2, lookup=_lookup, effects=Effects.ONCE)
def ledger_reconnect(ctx: ToolContext, key: Key) -> dict[str, Any]:
    """Record a key in the ledger; recovery asks the ledger by operation id first."""
    return _apply(ctx, key, "ledger_reconnect")


@tool(policy=RecoveryPolicy.INDETERMINATE, effects=Effects.ONCE)
def ledger_once(ctx: ToolContext, key: Key) -> dict[str, Any]:
    """Record a key in the ledger; never retried: an interrupted call becomes Indeterminate."""
    return _apply(ctx, key, "ledger_once")


@tool(policy=RecoveryPolicy.INDETERMINATE, permission=Permission.ASK, effects=Effects.ONCE)
def ledger_approval(ctx: ToolContext, key: Key) -> dict[str, Any]:
    """Record a key in the ledger after an operator approves it."""
    return _apply(ctx, key, "ledger_approval")


def _input_ticket(arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"question": arguments["question"]}, arguments["answer_schema"]


NO_SCHEMA = (
    "no input was asked: answer_schema is required, the JSON schema the person's answer must"
    ' match (for free text: {"type": "string"})'
)


class AskInputArguments(BaseModel):
    """A question for a person and the JSON schema its answer must match (both required)."""

    model_config = ConfigDict(extra="forbid")
    question: Annotated[
        str, Field(min_length=1, max_length=2000, description="what to ask the person")
    ]
    answer_schema: dict[str, Any] = Field(
        description='the JSON schema the answer must match (for free text: {"type": "string"})'
    )

    @model_validator(mode="before")
    @classmethod
    def _asks_with_a_schema(cls, data: Any) -> Any:
        """Refuse a call without answer_schema in words that say nothing was asked and what
        to send instead (issue 21: pydantic's "Field required" left a new user guessing)."""
        if isinstance(data, dict) and "answer_schema" not in data:
            raise PydanticCustomError("missing", NO_SCHEMA)
        return data


def _answered_by_its_ticket(ctx: ToolContext, **arguments: Any) -> Any:
    raise AssertionError("ask_input is answered through its input ticket, never executed")


# Built as a Tool, not with @tool, for its arguments model's own refusal (NO_SCHEMA). Without
# answer_schema the call completes at once with that error result, which the model sees.
ask_input = Tool(
    name="ask_input",
    description="Ask a person a question; the answer must match the given JSON schema.",
    fn=_answered_by_its_ticket,
    arguments_model=AskInputArguments,
    policy=RecoveryPolicy.INDETERMINATE,
    input_wait=InputWait(build=_input_ticket),
    effects=Effects.NONE,  # a person answers; nothing outside runs
)


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=3, effects=Effects.NONE)
async def slow(ctx: ToolContext, seconds: Annotated[float, Field(ge=0, le=3600)]) -> dict[str, Any]:
    """Wait the given number of seconds (replay-safe). An ``async def`` tool: while it waits
    it holds no thread of the worker."""
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=3, effects=Effects.NONE)
def wait(ctx: ToolContext, seconds: Annotated[float, Field(ge=0, le=31_536_000)]) -> dict[str, Any]:
    """Wait the given number of seconds without holding a worker (a timer ticket)."""
    ctx.wait_for(seconds)
    return {"waited": seconds}


class DelegateDemoArguments(BaseModel):
    """The demo's delegate tool: the child's task and, for the scripted child, its script."""

    model_config = ConfigDict(extra="forbid")
    input: Annotated[str, Field(min_length=1, max_length=20000, description="the child's task")]
    script: dict[str, Any] | None = Field(
        default=None, description="the scripted child's script (metadata.script of the child)"
    )


def _child_metadata(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"script": arguments["script"]} if arguments.get("script") is not None else {}


delegate_demo = delegate(
    agent="demo",
    name="delegate",
    description="Hand a task to a child demo agent and get its final answer.",
    arguments_model=DelegateDemoArguments,
    metadata=_child_metadata,
)


demo = Agent(
    name="demo",
    description="Scripted demo agent whose tools write to an effect ledger.",
    instructions=(
        "You are a demo agent. Use the ledger tools to record keys when asked; "
        "ask for input when you need it."
    ),
    tools=(
        ledger_replay,
        ledger_reconnect,
        ledger_once,
        ledger_approval,
        ask_input,
        slow,
        wait,
        delegate_demo,
    ),
    provider=ProviderConfig(kind="scripted"),
    step_limit=8,
)


def assistant() -> Agent:
    """The demo tools on a real model, configured from the environment.

    ``RUNTIME_MODEL_PROVIDER`` ("openai" for any OpenAI-compatible server, or "anthropic"),
    ``RUNTIME_MODEL_BASE_URL`` (default: a local Ollama at http://127.0.0.1:11434/v1),
    ``RUNTIME_MODEL`` (default "llama3.2"), ``RUNTIME_MODEL_API_KEY_ENV`` (the name of the
    variable holding the key, default "OPENAI_API_KEY" or "ANTHROPIC_API_KEY") and
    ``RUNTIME_MODEL_TIMEOUT`` (seconds, default 60); its MCP servers come from
    ``RUNTIME_MCP_SERVERS`` (see ``runtime.mcp.config.parse_servers``).
    """
    kind = os.environ.get("RUNTIME_MODEL_PROVIDER", "openai")
    default_key = "ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY"
    return Agent(
        name="assistant",
        description="The demo tools driven by a real model (see docs/real-models.md).",
        instructions=demo.instructions,
        tools=tuple(t for t in demo.tools if t.delegate is None),
        provider=ProviderConfig(
            kind=kind,
            model=os.environ.get("RUNTIME_MODEL", "llama3.2"),
            base_url=os.environ.get("RUNTIME_MODEL_BASE_URL")
            or (None if kind == "anthropic" else "http://127.0.0.1:11434/v1"),
            api_key_env=os.environ.get("RUNTIME_MODEL_API_KEY_ENV", default_key),
            timeout=float(os.environ.get("RUNTIME_MODEL_TIMEOUT", "60")),
        ),
        step_limit=12,
        sources=parse_servers(conf.mcp_servers()),
    )
