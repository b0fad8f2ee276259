"""One agent, ``deploy``, as a team deploys it while runs wait (issue 34).

``v1`` is the demo (its tools and scripted model) plus ``refund``, which asks for approval
and applies an effect once, and ``sync``, an idempotent effect retried on a stop. Each other
version is ``v1`` with one change a deploy makes: a tool removed, renamed, given a new
required argument, or given a new policy.
"""

from __future__ import annotations

from dataclasses import replace

from runtime.agents import Agent
from runtime.demo.agent import demo
from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.tools import Tool, ToolContext, tool

APPLIED: list[tuple[str, str, str]] = []  # (tool, version, order or key): effects, in order


@tool(policy=RecoveryPolicy.INDETERMINATE, permission=Permission.ASK, effects=Effects.ONCE)
def refund(ctx: ToolContext, order: str) -> str:
    """Refund an order, once an operator approves."""
    APPLIED.append(("refund", "v1", order))
    return f"refunded {order}"


@tool(policy=RecoveryPolicy.REPLAY, max_attempts=2, effects=Effects.IDEMPOTENT)
def sync(ctx: ToolContext, key: str) -> str:
    """Copy a record downstream (the same operation id applies it once)."""
    APPLIED.append(("sync", "v1", key))
    return f"synced {key}"


@tool(policy=RecoveryPolicy.RECONNECT, lookup=lambda ctx: None, effects=Effects.ONCE)
def charge(ctx: ToolContext, order: str) -> str:
    """Charge an order; recovery asks the payment system by operation id."""
    APPLIED.append(("charge", "v1", order))
    return f"charged {order}"


@tool(name="refund_order", policy=RecoveryPolicy.INDETERMINATE, effects=Effects.ONCE)
def refund_renamed(ctx: ToolContext, order: str) -> str:
    """Refund an order (``refund`` of v1, renamed)."""
    APPLIED.append(("refund_order", "renamed", order))
    return f"refunded {order}"


@tool(
    name="refund",
    policy=RecoveryPolicy.INDETERMINATE,
    permission=Permission.ASK,
    effects=Effects.ONCE,
)
def refund_with_amount(ctx: ToolContext, order: str, amount: int) -> str:
    """Refund part of an order: ``amount`` is new and required."""
    APPLIED.append(("refund", "new_argument", order))
    return f"refunded {amount} of {order}"


@tool(name="refund", policy=RecoveryPolicy.REPLAY, max_attempts=3, effects=Effects.IDEMPOTENT)
def refund_replayed(ctx: ToolContext, order: str) -> str:
    """Refund an order, now idempotent downstream and allowed without approval."""
    APPLIED.append(("refund", "new_policy", order))
    return f"refunded {order}"


def _version(*tools: Tool) -> Agent:
    return replace(demo, name="deploy", tools=(*demo.tools, *tools))


v1 = _version(refund, sync, charge)
removed = _version()  # refund, sync and charge deleted
renamed = _version(refund_renamed, sync, charge)
new_argument = _version(refund_with_amount, sync, charge)
new_policy = _version(refund_replayed, sync, charge)
