"""The provider contract: a request built from committed facts only, live Deltas, a result.

An ``InferenceRequest`` is a value: the same committed thread and agent give the same request
and the same ``digest()``, whichever worker builds it (DESIGN.md, "Publication order").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.domain.model import Message
from runtime.untrusted import storable_text


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceRequest:
    """What the model is asked: instructions, committed messages, tools and options."""

    model: str
    instructions: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def canonical(self) -> bytes:
        """The request as canonical JSON bytes (sorted keys, no spaces, UTF-8)."""
        from runtime import codec

        return json.dumps(
            codec.dump(self), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()

    def digest(self) -> str:
        """SHA-256 of ``canonical()``, recorded on the committed assistant message."""
        return hashlib.sha256(self.canonical()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Delta:
    """A live, unconfirmed fragment: text, or a tool call's name or argument text by index."""

    kind: str  # "text" | "tool_call"
    text: str = ""
    index: int = 0
    name: str | None = None
    call_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it (made storable)

    def __post_init__(self) -> None:
        # Model output reaches text columns: every provider's result passes here (issue 12).
        for name in ("id", "name", "arguments"):
            object.__setattr__(self, name, storable_text(getattr(self, name)))


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceResult:
    text: str = ""
    tool_calls: tuple[ToolCallOut, ...] = ()
    finish_reason: str = "stop"
    usage: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", storable_text(self.text))
        object.__setattr__(self, "finish_reason", storable_text(self.finish_reason))


class ModelError(Exception):
    """An inference failed. ``retryable`` errors are retried with backoff within a budget;
    the others end the run as failed with this error (provider, status, message)."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after

    def as_error(self) -> dict[str, Any]:
        return {
            "type": "model_error",
            "provider": self.provider,
            "status": self.status,
            "message": self.message,
            "retryable": self.retryable,
        }


@dataclass(slots=True, kw_only=True)
class InferenceContext:
    """Where an inference runs: the run, its step and attempt (from 1), and two sinks.

    ``on_delta`` publishes a live Delta (never fails the run); ``checkpoint`` optionally
    saves partial output best-effort; ``resume_from`` is a checkpoint a retry may continue
    from (text so far, completed tool calls).
    """

    run_id: str
    step: int
    attempt: int
    metadata: Mapping[str, Any]
    on_delta: Callable[[Delta], None]
    checkpoint: Callable[[str, list[dict[str, Any]]], None] = lambda text, calls: None
    resume_from: Mapping[str, Any] | None = None


class Provider(Protocol):
    """A model provider. ``infer`` runs on the worker's event loop: it awaits the network
    (an SDK's async client) and never blocks the loop. A provider that holds a client also
    has ``async close()``."""

    name: str

    async def infer(self, request: InferenceRequest, ctx: InferenceContext) -> InferenceResult:
        """Run one inference, streaming Deltas; raise ModelError on failure."""
        ...
