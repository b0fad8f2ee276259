"""Plugin hooks of one Step (DESIGN.md "One Step"), called in the agent's plugin order.

A plugin is any object with some of these methods; missing ones are skipped:

- ``step_start(run)``: observe; return value ignored.
- ``step_end(run, result) -> bool``: True asks for another Step after a text-only answer
  (which otherwise ends the run naturally).
- ``before_inference(run, messages) -> list[Message]``: request-only context appended to the
  request (never committed).
- ``after_inference(run, result) -> None``: observe the model's answer before it is committed.
- ``gate(run, call) -> Permission | None``: tighten a call's permission ("ask" or "deny");
  None leaves it.
- ``after_tool(run, call, result_text, is_error) -> str | None``: replace the result text.

StepStart, BeforeInference, AfterInference and AfterTool hooks may call
``runtime.staging.stage(self, value)`` to stage typed state, committed with that boundary.

``run`` is the committed RunView; hooks must be deterministic in committed facts so that a
recovering worker builds the same request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runtime import staging


def call_hooks(plugins: Iterable[Any], name: str, *args: Any) -> list[Any]:
    """Call ``name`` on every plugin that has it; return their answers in order."""
    answers = []
    for plugin in plugins:
        method = getattr(plugin, name, None)
        if method is not None:
            with staging.in_hook(name):
                answers.append(method(*args))
    return answers


def has_hook(plugins: Iterable[Any], name: str) -> bool:
    """Whether any plugin has the hook ``name``."""
    return any(getattr(plugin, name, None) is not None for plugin in plugins)
