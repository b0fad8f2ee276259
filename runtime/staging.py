"""Staged plugin state: typed state a plugin stages in a hook and the boundary's commit carries.

A plugin declares ``state_key`` (its key in the run's state) and ``state_model`` (a pydantic
model). In a StepStart, BeforeInference, AfterInference or AfterTool hook it calls
``stage(self, value)``: the value is validated now and kept in memory by the driver, which adds
it to its next commit (the inference commit for the first three, the call's result commit for
AfterTool) as a ``StateStaged`` event, never earlier. A crash before that commit loses only the
staged value. The fold rebuilds ``RunView.plugin_state``; ``committed(plugin, run)`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from runtime.domain.events import StateStaged
from runtime.domain.model import RunView
from runtime.errors import InvalidCommit

STAGING_HOOKS = frozenset({"step_start", "before_inference", "after_inference", "after_tool"})


class InvalidStagedState(InvalidCommit):
    """The staged state is refused: staged outside a staging hook, by a plugin without
    ``state_key`` and ``state_model``, or not valid for its model."""

    code = "invalid_staged_state"


class StatefulPlugin[M: BaseModel](Protocol):
    """A plugin with staged state: its key in ``RunView.plugin_state`` and its model."""

    state_key: str
    state_model: type[M]


class Stage:
    """What one driver's hooks staged since its last commit, by plugin key."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}

    def events(self) -> tuple[StateStaged, ...]:
        return tuple(StateStaged(key=k, value=v) for k, v in sorted(self.values.items()))

    def clear(self) -> None:
        self.values.clear()


_stage: ContextVar[Stage | None] = ContextVar("runtime_stage", default=None)
_hook: ContextVar[str | None] = ContextVar("runtime_hook", default=None)


@contextmanager
def active(stage: Stage) -> Iterator[Stage]:
    """Make ``stage`` the target of ``stage()`` calls in this context (one driver)."""
    token = _stage.set(stage)
    try:
        yield stage
    finally:
        _stage.reset(token)


@contextmanager
def in_hook(name: str) -> Iterator[None]:
    token = _hook.set(name)
    try:
        yield
    finally:
        _hook.reset(token)


def _declared[M: BaseModel](plugin: StatefulPlugin[M]) -> tuple[str, type[M]]:
    key, model = getattr(plugin, "state_key", None), getattr(plugin, "state_model", None)
    if not isinstance(key, str) or not key or not isinstance(model, type):
        raise InvalidStagedState(f"{type(plugin).__name__} declares no state_key and state_model")
    return key, model


def stage(plugin: Any, value: BaseModel | dict[str, Any]) -> None:
    """Stage ``value`` as ``plugin``'s state; it is committed with this boundary's commit.

    Raises InvalidStagedState outside StepStart/BeforeInference/AfterInference/AfterTool, for
    an undeclared plugin, or when ``value`` does not validate against ``plugin.state_model``.
    """
    current, hook = _stage.get(), _hook.get()
    if current is None or hook not in STAGING_HOOKS:
        raise InvalidStagedState(f"state is staged only in {sorted(STAGING_HOOKS)} hooks")
    key, model = _declared(plugin)
    raw = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    try:
        current.values[key] = model.model_validate(raw).model_dump(mode="json")
    except ValidationError as exc:
        raise InvalidStagedState(f"{key}: {exc.errors()[0]['msg']}", key=key) from exc


def pending(plugin: Any) -> dict[str, Any] | None:
    """The plugin's value staged since the last commit (JSON), or None."""
    current = _stage.get()
    key, _ = _declared(plugin)
    return current.values.get(key) if current is not None else None


def committed[M: BaseModel](plugin: StatefulPlugin[M], run: RunView) -> M | None:
    """The plugin's committed state in ``run`` as its model, or None when none is committed."""
    key, model = _declared(plugin)
    value = run.plugin_state.get(key)
    return None if value is None else model.model_validate(value)


def problems(plugins: Any, run: RunView) -> list[str]:
    """Why ``run``'s committed plugin state does not validate (for the log checker)."""
    found = []
    for plugin in plugins:
        key = getattr(plugin, "state_key", None)
        if key in run.plugin_state:
            try:
                committed(plugin, run)
            except (ValidationError, InvalidStagedState) as exc:
                found.append(f"plugin state {key!r} does not validate: {exc}")
    return found
