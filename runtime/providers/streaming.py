"""What both network providers do while a response streams: assemble it, publish, checkpoint.

``StreamSink`` holds one attempt's text and tool calls as they arrive, publishes each piece as
a live ``Delta`` and calls ``ctx.checkpoint(text, complete_calls)`` every ``CHECKPOINT_EVERY``
deltas and whenever a tool call completes. Both sinks are best-effort: a failing ``on_delta``
or ``checkpoint`` is logged and never fails the inference (DESIGN.md, "One Step").

Delta protocol (the scripted provider's, too): text arrives as ``Delta(kind="text", text=...)``;
a tool call opens with ``Delta(kind="tool_call", index=i, name=..., call_id=...)`` and its raw
argument text follows in ``Delta(kind="tool_call", index=i, text=...)`` fragments. ``index`` is
the call's position in the batch (0, 1, ...), whatever the wire's own indexing.

``resume_from`` is not spliced into the result: a retry sends the same request again and its
result is only what that attempt's stream produced (see ``restart_note``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.providers.base import (
    Delta,
    InferenceContext,
    InferenceResult,
    ToolCallOut,
)

log = logging.getLogger("runtime.providers")

CHECKPOINT_EVERY = 8  # deltas between two best-effort checkpoints


@dataclass(slots=True)
class PartialCall:
    """One tool call being assembled; ``arguments`` is raw text until the call completes."""

    index: int
    id: str
    name: str = ""
    parts: list[str] = field(default_factory=list)
    announced: bool = False
    complete: bool = False

    @property
    def arguments(self) -> str:
        """The raw argument text; a call with no argument text at all is ``{}``."""
        return "".join(self.parts) or "{}"

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def parses(self) -> bool:
        try:
            json.loads(self.arguments)
        except ValueError:
            return False
        return True


class StreamSink:
    """One attempt's output: publishes Deltas, checkpoints, and builds the InferenceResult."""

    def __init__(self, ctx: InferenceContext, provider: str) -> None:
        self.ctx = ctx
        self.provider = provider
        self.text_parts: list[str] = []
        self.calls: list[PartialCall] = []
        self._since_checkpoint = 0
        if ctx.resume_from:
            log.info("%s: %s", provider, restart_note(ctx.resume_from))

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add_text(self, piece: str) -> None:
        if not piece:
            return
        self.text_parts.append(piece)
        self._publish(Delta(kind="text", text=piece))

    def open_call(self, call_id: str | None, name: str = "") -> PartialCall:
        """Start the next tool call; a missing id becomes ``call_<step>_<index>``."""
        index = len(self.calls)
        call = PartialCall(index=index, id=self._unique_id(call_id, index), name=name)
        self.calls.append(call)
        if name:
            self.announce(call)
        return call

    def name_call(self, call: PartialCall, name: str) -> None:
        if name and not call.name:
            call.name = name
            self.announce(call)

    def announce(self, call: PartialCall) -> None:
        if not call.announced:
            call.announced = True
            self._publish(
                Delta(kind="tool_call", index=call.index, name=call.name, call_id=call.id)
            )

    def add_arguments(self, call: PartialCall, piece: str) -> None:
        if not piece:
            return
        self.announce(call)
        call.parts.append(piece)
        self._publish(Delta(kind="tool_call", index=call.index, text=piece))

    def complete_call(self, call: PartialCall) -> None:
        if call.complete:
            return
        call.complete = True
        self._checkpoint()

    def result(self, finish_reason: str, usage: Mapping[str, Any]) -> InferenceResult:
        return InferenceResult(
            text=self.text,
            tool_calls=tuple(
                ToolCallOut(id=c.id, name=c.name, arguments=c.arguments) for c in self.calls
            ),
            finish_reason=finish_reason,
            usage=dict(usage),
        )

    def _unique_id(self, call_id: str | None, index: int) -> str:
        taken = {c.id for c in self.calls}
        if call_id and call_id not in taken:
            return call_id
        generated = f"call_{self.ctx.step}_{index}"
        while generated in taken:
            generated += "_"
        return generated

    def _publish(self, delta: Delta) -> None:
        try:
            self.ctx.on_delta(delta)
        except Exception:  # the live stream is best-effort by design
            log.warning("%s: publishing a live delta failed", self.provider, exc_info=True)
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_EVERY:
            self._checkpoint()

    def _checkpoint(self) -> None:
        self._since_checkpoint = 0
        complete = [c.as_dict() for c in self.calls if c.complete]
        try:
            self.ctx.checkpoint(self.text, complete)
        except Exception:  # a checkpoint is an optimisation; losing one loses nothing
            log.warning("%s: writing a stream checkpoint failed", self.provider, exc_info=True)


def restart_note(resume_from: Mapping[str, Any]) -> str:
    """Why a retry ignores its checkpoint: the request is restarted, not continued.

    A new attempt is an independent generation: gluing an earlier attempt's partial text or
    calls onto it would commit output that no single response contained, and neither API
    continues a tool call half-way. So the provider sends the byte-identical request (the
    committed request digest stays true) and returns only the new stream's output; its
    Deltas start from the beginning again, tagged by the loop with the new attempt number,
    so a live viewer replaces the interrupted attempt's unconfirmed text instead of appending.
    """
    calls = resume_from.get("tool_calls") or []
    text = resume_from.get("text") or ""
    return (
        f"restarting the request; the checkpoint of the interrupted attempt "
        f"({len(text)} characters, {len(calls)} complete tool calls) is not reused"
    )
