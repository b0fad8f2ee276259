"""Agents: a model provider and its settings, instructions, tools, step limit and permissions.

Agents are Python values registered by dotted path in ``settings.RUNTIME_AGENTS``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from runtime import conf, sources
from runtime.domain.limits import RunLimit
from runtime.domain.model import Permission, ToolCall
from runtime.errors import UnknownAgent
from runtime.tools import Tool


@dataclass(frozen=True)
class ProviderConfig:
    """Which model an agent talks to.

    ``kind`` names a provider kind: "scripted", "openai" (any OpenAI-compatible server),
    "anthropic", or one a project adds in ``RUNTIME_PROVIDERS`` (``runtime.providers``).
    ``api_key_env`` names the environment variable holding the key; ``timeout`` is in seconds;
    ``options`` are extra request fields (temperature, max_tokens, ...).
    """

    kind: str = "scripted"
    model: str = ""
    base_url: str | None = None
    api_key_env: str | None = None
    timeout: float = 60.0
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Agent:
    """An agent definition. ``permissions`` overrides a tool's default permission by name;
    ``plugins`` are objects with optional hook methods (see ``runtime.hooks``);
    ``sources`` are definitions of tool sources whose tools the agent also offers, each
    naming its kind (``runtime.sources``; e.g. ``runtime.mcp.StdioServer``). ``attached``
    holds each source kind's state for one claim (set by ``runtime.sources.attached``, empty
    in a definition). ``limits`` bounds how many of its runs are driven at once (the
    RUNTIME_RUN_LIMITS entry of its name, when there is one, wins; ``runtime.limits``)."""

    name: str
    instructions: str
    tools: tuple[Tool, ...] = ()
    provider: ProviderConfig = field(default_factory=ProviderConfig)
    step_limit: int = 10
    permissions: Mapping[str, Permission] = field(default_factory=dict)
    plugins: tuple[Any, ...] = ()
    description: str = ""
    sources: tuple[Any, ...] = ()
    attached: Mapping[str, Any] = field(default_factory=dict)
    limits: RunLimit | None = None
    version: str | None = None

    @cached_property
    def deployed_version(self) -> str:
        """The version of this definition that runs and commits record (issue 34): its
        author's ``version`` when given, else ``"d-"`` and 12 hex digits of a digest of what
        the model and the tools' recovery see (instructions, step limit, permissions, the
        provider's kind, model and options, each tool's name, description, argument schema,
        policy, permission, budget and effects, the sources' and plugins' kinds). Computed
        once per definition."""
        if self.version:
            return self.version
        return "d-" + hashlib.sha256(_definition(self).encode()).hexdigest()[:12]

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def tool_for(self, call: ToolCall) -> Tool | None:
        """The tool that executes ``call``: a Python call's is the agent's tool of its name,
        a source's is rebuilt by its source from what it pinned (``runtime.sources``)."""
        return sources.pinned_tool(self, call)

    def permission_for(self, tool: Tool) -> Permission:
        return self.permissions.get(tool.name, tool.permission)


def _definition(agent: Agent) -> str:
    """``agent``'s definition as canonical JSON text (what ``deployed_version`` digests)."""
    provider = agent.provider
    shape = {
        "name": agent.name,
        "instructions": agent.instructions,
        "step_limit": agent.step_limit,
        "permissions": {name: str(p) for name, p in sorted(agent.permissions.items())},
        "provider": [provider.kind, provider.model, provider.base_url, dict(provider.options)],
        "tools": [
            [t.name, t.description, t.parameters, str(t.policy), str(t.permission)]
            + [t.max_attempts, str(t.effects), t.delegate is not None, t.input_wait is not None]
            for t in agent.tools
        ],
        "sources": [type(s).__name__ for s in agent.sources],
        "plugins": [type(p).__name__ for p in agent.plugins],
    }
    return json.dumps(shape, sort_keys=True, default=str)


def load_agent(path: str) -> Agent:
    """The Agent at dotted ``path``: an Agent, or a callable returning one.

    Raises ImproperlyConfigured naming RUNTIME_AGENTS and the path when it cannot be imported,
    its factory fails, or it is no Agent (the ``runtime.E001`` check reports the same)."""
    try:
        agent = import_string(path)
        if callable(agent) and not isinstance(agent, Agent):
            agent = agent()
    except (Exception, SystemExit) as exc:  # an import error, whatever a factory raised
        raise ImproperlyConfigured(f"RUNTIME_AGENTS: cannot load {path!r}: {exc!r}") from exc
    if not isinstance(agent, Agent):
        raise ImproperlyConfigured(
            f"RUNTIME_AGENTS: {path!r} is a {type(agent).__name__}, not a runtime Agent"
        )
    return agent


@cache
def _registry(paths: tuple[str, ...]) -> dict[str, Agent]:
    loaded: dict[str, Agent] = {}
    for path in paths:
        agent = load_agent(path)
        if agent.name in loaded:
            raise ImproperlyConfigured(
                f"RUNTIME_AGENTS: {path!r} is named {agent.name!r}, as an agent before it is"
            )
        loaded[agent.name] = agent
    return loaded


def registry() -> dict[str, Agent]:
    """Every registered agent by name (``settings.RUNTIME_AGENTS``); raises
    ImproperlyConfigured when one cannot be loaded (``load_agent``) or two share a name."""
    return _registry(tuple(conf.agent_paths()))


def get_agent(name: str) -> Agent:
    """Return the agent named ``name``; raise UnknownAgent whose message names the known
    agents and the setting that lists them (``detail.known`` holds the names)."""
    agents = registry()
    if name not in agents:
        known = sorted(agents)
        raise UnknownAgent(
            f"unknown agent {name!r}; the known agents are {', '.join(known)}. Agents are"
            " listed by dotted path in the RUNTIME_AGENTS setting (e.g."
            " RUNTIME_AGENTS=runtime.demo.agent.demo,myproject.agents.fx)",
            known=known,
        )
    return agents[name]
