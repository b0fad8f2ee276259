"""A test agent whose extra tools raise a plain exception on every attempt (issue 31, item 7),
one per declared effect: ``raising`` is the demo (its tools and scripted model) plus them."""

from __future__ import annotations

from dataclasses import replace

from runtime.demo.agent import demo
from runtime.domain.model import Effects, RecoveryPolicy
from runtime.tools import ToolContext, tool

AGENT = "tests.runtime.raising_agent.raising"


def _bug(ctx: ToolContext) -> str:
    raise KeyError(f"bug at attempt {ctx.attempt}")


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=2, effects=Effects.NONE)
def broken_read(ctx: ToolContext) -> str:
    """Read nothing, raise."""
    return _bug(ctx)


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=2, effects=Effects.IDEMPOTENT)
def broken_idempotent(ctx: ToolContext) -> str:
    """An idempotent effect whose code raises."""
    return _bug(ctx)


@tool(policy=RecoveryPolicy.INDETERMINATE, effects=Effects.ONCE)
def broken_once(ctx: ToolContext) -> str:
    """An effect applied at most once, whose code raises: it may have started."""
    return _bug(ctx)


raising = replace(
    demo, name="raising", tools=(*demo.tools, broken_read, broken_idempotent, broken_once)
)
