"""A test agent whose plugin stages typed state in every staging hook (importable by worker
subprocesses through RUNTIME_AGENTS)."""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, Field

from runtime import staging
from runtime.demo.agent import demo


class Tally(BaseModel):
    steps: int = Field(ge=0)
    tools: list[str] = Field(default_factory=list)
    last_finish: str | None = None


class Counter:
    """Counts steps from committed state (so a recovering worker never counts twice)."""

    state_key = "counter"
    state_model = Tally

    def _current(self, run) -> Tally:
        return staging.committed(self, run) or Tally(steps=0)

    def step_start(self, run) -> None:
        tally = self._current(run)
        staging.stage(self, tally.model_copy(update={"steps": tally.steps + 1}))

    def after_inference(self, run, result) -> None:
        staged = staging.pending(self) or self._current(run).model_dump()
        staging.stage(self, {**staged, "last_finish": result.finish_reason})

    def after_tool(self, run, call, result, is_error) -> None:
        tally = self._current(run)
        staging.stage(self, tally.model_copy(update={"tools": [*tally.tools, call.name]}))

    def gate(self, run, call) -> None:
        return None


counting = replace(demo, name="counting", plugins=(Counter(),))
