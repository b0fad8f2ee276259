"""Drive runs into committed states through the coordinator, as a worker would (no worker).

Shared by the console view tests and the browser tests.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from runtime import operations
from runtime.commits import commit
from runtime.coordinator import read_head, read_run
from runtime.domain.commit import CommitDraft, publication
from runtime.domain.events import (
    BatchFinalized,
    BatchOpened,
    CallAwaiting,
    CallCompleted,
    CallExecuting,
    StepCommitted,
)
from runtime.domain.model import (
    Disposition,
    Effects,
    EndCause,
    Message,
    Permission,
    RecoveryPolicy,
    ResumeTicket,
    TicketKind,
    ToolCall,
)

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "account": {"type": "string", "minLength": 2, "description": "account code"},
        "amount": {"type": "number", "minimum": 0},
        "count": {"type": "integer", "maximum": 10},
        "urgent": {"type": "boolean"},
        "currency": {"enum": ["EUR", "USD"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["account", "amount"],
}


class RunDriver:
    """Drives one run through committed states with the coordinator, as a worker would."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.calls: list[ToolCall] = []

    @property
    def view(self):
        return read_run(self.run_id)

    def _commit(self, disposition, *, events=(), messages=(), actor="worker-test") -> None:
        view = self.view
        commit(
            CommitDraft(
                thread_id=view.thread_id,
                run_id=self.run_id,
                expected_version=read_head(view.thread_id).version,
                disposition=disposition,
                messages=tuple(messages),
                events=tuple(events),
                actor=actor,
            )
        )

    def text_step(self, text: str, *, end: bool = False) -> None:
        step = self.view.step + 1
        self._commit(
            Disposition.ended(EndCause.NATURAL) if end else Disposition.running(),
            events=(StepCommitted(step=step),),
            messages=(Message(role="assistant", content=text),),
        )

    def open_batch(self, *specs: dict[str, Any], text: str = "") -> list[ToolCall]:
        """specs: {"name", "arguments", "permission"?, "policy"?, "effects"?}; returns the
        calls."""
        step = self.view.step + 1
        calls = []
        for index, spec in enumerate(specs):
            raw = spec.get("arguments_text") or json.dumps(spec.get("arguments", {}))
            calls.append(
                ToolCall(
                    call_id=uuid.uuid4().hex,
                    index=index,
                    tool_call_id=f"call_{step}_{index}",
                    name=spec["name"],
                    arguments=spec.get("arguments"),
                    arguments_text=raw,
                    operation_id=uuid.uuid4().hex,
                    policy=RecoveryPolicy(spec.get("policy", "indeterminate")),
                    permission=Permission(spec.get("permission", "allow")),
                    max_attempts=spec.get("max_attempts", 1),
                    effects=Effects(spec.get("effects", "once")),
                )
            )
        message = Message(
            role="assistant",
            content=text,
            tool_calls=tuple(
                {"id": c.tool_call_id, "name": c.name, "arguments": c.arguments_text} for c in calls
            ),
        )
        self._commit(
            Disposition.running(),
            events=(StepCommitted(step=step), BatchOpened(step=step, calls=tuple(calls))),
            messages=(message,),
        )
        self.calls = calls
        return calls

    def await_ticket(
        self, call: ToolCall, kind: str = "approval", *, request=None, schema=None
    ) -> str:
        ticket_id = uuid.uuid4().hex
        ticket = ResumeTicket(
            id=ticket_id,
            run_id=self.run_id,
            call_id=call.call_id,
            kind=TicketKind(kind),
            request=request or {},
            schema=schema,
        )
        self._commit(
            Disposition.awaiting(ticket),
            events=(CallAwaiting(call_id=call.call_id, ticket_id=ticket_id),),
        )
        return ticket_id

    def execute(self, call: ToolCall, attempt: int = 1, worker: str = "worker-a") -> None:
        self._commit(
            Disposition.running(),
            events=(CallExecuting(call_id=call.call_id, attempt=attempt, worker=worker),),
        )

    def complete(self, call: ToolCall, result: str) -> None:
        self._commit(
            Disposition.running(), events=(CallCompleted(call_id=call.call_id, result=result),)
        )

    def finalize(self) -> None:
        """Publish the open batch's results and finalize it (every call must be terminal)."""
        batch = self.view.open_batch
        assert batch is not None
        self._commit(
            Disposition.running(),
            events=(BatchFinalized(step=batch.step),),
            messages=publication(batch),
        )

    def fail(self, reason: str = "the worker was lost") -> None:
        operations.end_run(self.run_id, EndCause.FAILED, reason=reason, actor="worker-test")
