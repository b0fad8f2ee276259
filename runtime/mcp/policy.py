"""The recovery policy an MCP tool gets from its annotations, before the operator's overrides.

Annotations are the server's hints (MCP specification, ToolAnnotations), so they only choose
defaults: a tool that says it is read-only or idempotent is safe to run again with the same
operation id (``replay``); one that says it is destructive, or says nothing, is never guessed
about (``indeterminate``) and asks an operator first. A per-tool ToolOverride wins over both.
The same hints say whether a call can change anything outside (Effects): ``readOnlyHint``
means none, ``idempotentHint`` idempotent, anything else (or nothing) once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.mcp.config import ToolOverride

REPLAY_ATTEMPTS = 3  # attempts a replay-safe MCP call gets unless overridden


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPolicy:
    """What gets pinned into each call of one MCP tool."""

    policy: RecoveryPolicy
    permission: Permission
    max_attempts: int
    lookup: str | None = None
    effects: Effects = Effects.ONCE


def effects_of(annotations: Any) -> Effects:
    """The Effects an MCP tool's annotations declare (MCP specification, ToolAnnotations):
    ``readOnlyHint`` true -> none (it does not modify its environment), ``idempotentHint``
    true -> idempotent, otherwise (destructive, additive or unannotated) -> once."""
    if getattr(annotations, "read_only_hint", None):
        return Effects.NONE
    if getattr(annotations, "idempotent_hint", None):
        return Effects.IDEMPOTENT
    return Effects.ONCE


def derive(annotations: Any, override: ToolOverride | None = None) -> ToolPolicy:
    """Return the pinned policy for a tool with ``annotations`` (a ToolAnnotations-like object
    with ``read_only_hint``/``destructive_hint``/``idempotent_hint``, or None) and the agent's
    ``override``.

    Rules (issue 14): read-only or idempotent -> replay, allow, 3 attempts; otherwise
    indeterminate, 1 attempt, and ``ask`` when destructive or when there are no annotations
    (the specification's default for ``destructiveHint`` is true); a tool that declares itself
    neither destructive nor idempotent is indeterminate and allowed. The effects come from
    ``effects_of(annotations)`` unless the override names them.
    """
    effects = effects_of(annotations)
    read_only = bool(getattr(annotations, "read_only_hint", None))
    idempotent = bool(getattr(annotations, "idempotent_hint", None))
    destructive = getattr(annotations, "destructive_hint", None) is not False
    if read_only or idempotent:
        base = ToolPolicy(
            policy=RecoveryPolicy.REPLAY,
            permission=Permission.ALLOW,
            max_attempts=REPLAY_ATTEMPTS,
            effects=effects,
        )
    else:
        ask = annotations is None or destructive
        base = ToolPolicy(
            policy=RecoveryPolicy.INDETERMINATE,
            permission=Permission.ASK if ask else Permission.ALLOW,
            max_attempts=1,
            effects=effects,
        )
    if override is None:
        return base
    policy = override.policy or base.policy
    return ToolPolicy(
        policy=policy,
        permission=override.permission or base.permission,
        max_attempts=override.max_attempts
        or (base.max_attempts if policy is base.policy else _attempts_for(policy)),
        lookup=override.lookup,
        effects=override.effects or base.effects,
    )


def _attempts_for(policy: RecoveryPolicy) -> int:
    return 1 if policy is RecoveryPolicy.INDETERMINATE else REPLAY_ATTEMPTS
