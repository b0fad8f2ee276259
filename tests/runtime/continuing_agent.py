"""A test agent with a ``step_end`` hook: it may go on after a text-only answer."""

from __future__ import annotations

from dataclasses import replace

from runtime.demo.agent import demo


class GoOnOnce:
    """Asks for one more Step after the first text-only answer."""

    def step_end(self, run, result) -> bool:
        return run.step < 2


continuing = replace(demo, name="continuing", plugins=(GoOnOnce(),))
