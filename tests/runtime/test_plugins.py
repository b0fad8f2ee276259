"""Provider kinds and tool sources are found by name (``runtime.plugins``): a provider a
project defines is named by dotted path in RUNTIME_PROVIDERS and used by a run, an unknown
kind fails the run with an error naming the setting, and the MCP tool source is found by kind
without the agent naming it."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from runtime import sources
from runtime.agents import Agent, ProviderConfig
from runtime.domain.model import Permission, RecoveryPolicy, ToolCall
from runtime.operations import start_run
from runtime.providers import build_provider
from runtime.providers.base import Delta, InferenceContext, InferenceRequest, InferenceResult
from tests.runtime.support import assert_log_sound, assistant_messages, run_row

pytestmark = pytest.mark.django_db(transaction=True)

HERE = "tests.runtime.test_plugins"


class EchoProvider:
    """A provider of this test module: answers with the model name and the last message."""

    name = "echo"
    made: list[ProviderConfig] = []

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        EchoProvider.made.append(config)

    async def infer(self, request: InferenceRequest, ctx: InferenceContext) -> InferenceResult:
        text = f"{request.model} heard {request.messages[-1].content}"
        ctx.on_delta(Delta(kind="text", text=text))
        return InferenceResult(text=text)


echo = Agent(name="echo", instructions="", provider=ProviderConfig(kind="echo", model="e-1"))
nowhere = Agent(name="nowhere", instructions="", provider=ProviderConfig(kind="gemini"))


@pytest.fixture
def agents(settings: Any) -> None:
    settings.RUNTIME_AGENTS = [*settings.RUNTIME_AGENTS, f"{HERE}.echo", f"{HERE}.nowhere"]
    settings.RUNTIME_PROVIDERS = {"echo": f"{HERE}.EchoProvider"}


def test_a_provider_named_by_dotted_path_answers_a_run(agents, work_inline):
    run_id = start_run(agent="echo", input="hello")
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    assert assistant_messages(run_id)[-1].content == "e-1 heard hello"
    assert EchoProvider.made[-1].model == "e-1"
    assert_log_sound(run_id)


def test_an_unknown_kind_fails_the_run_naming_the_setting(agents, work_inline):
    run_id = start_run(agent="nowhere", input="hello")
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "failed")
    assert run.error["retryable"] is False
    assert "unknown kind 'gemini'" in run.error["message"]
    assert "RUNTIME_PROVIDERS" in run.error["message"]
    assert_log_sound(run_id)


def test_an_unknown_kind_is_refused_by_build_provider_listing_the_known_ones(settings):
    settings.RUNTIME_PROVIDERS = {}
    with pytest.raises(ImproperlyConfigured) as refused:
        build_provider(ProviderConfig(kind="gemini"), {})
    message = str(refused.value)
    assert "RUNTIME_PROVIDERS" in message
    assert "anthropic, openai, scripted" in message


def test_a_path_that_does_not_import_names_the_setting_and_the_path(settings):
    settings.RUNTIME_PROVIDERS = {"echo": f"{HERE}.NoSuchProvider"}
    with pytest.raises(ImproperlyConfigured, match=r"RUNTIME_PROVIDERS: cannot import 'echo'"):
        build_provider(ProviderConfig(kind="echo"), {})


def test_a_setting_that_is_no_mapping_is_refused(settings):
    settings.RUNTIME_PROVIDERS = ["echo"]
    with pytest.raises(ImproperlyConfigured, match="RUNTIME_PROVIDERS must map kind names"):
        build_provider(ProviderConfig(kind="scripted"), {})


def test_a_project_kind_may_replace_a_built_in_one(settings):
    settings.RUNTIME_PROVIDERS = {"openai": f"{HERE}.EchoProvider"}
    assert isinstance(build_provider(ProviderConfig(kind="openai"), {}), EchoProvider)


def _call(name: str, source: dict[str, Any]) -> ToolCall:
    return ToolCall(
        call_id="c1",
        index=0,
        tool_call_id="t1",
        name=name,
        arguments={},
        arguments_text="{}",
        operation_id="op1",
        policy=RecoveryPolicy.INDETERMINATE,
        permission=Permission.ALLOW,
        source={**source, "target": "x"},
    )


def test_a_source_call_is_rebuilt_by_its_source_found_by_kind():
    """An agent that no longer lists any MCP server still recovers a call its MCP tool pinned:
    the source is found by kind (RUNTIME_TOOL_SOURCES' built-in default)."""
    call = _call("files__read", {"kind": "mcp", "server": "files", "transport": "stdio"})
    tool = sources.pinned_tool(Agent(name="a", instructions=""), call)
    assert tool is not None and tool.source["server"] == "files"
    assert "no MCP server 'files' any more" in getattr(tool, "unavailable", "")


def test_an_unknown_source_kind_names_the_setting():
    call = _call("x", {"kind": "carrier-pigeon"})
    with pytest.raises(ImproperlyConfigured, match="RUNTIME_TOOL_SOURCES"):
        sources.pinned_tool(Agent(name="a", instructions=""), call)
