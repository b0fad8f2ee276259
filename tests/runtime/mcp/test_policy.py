"""Pure rules of the MCP package: policies from annotations, result text, definitions."""

from __future__ import annotations

import asyncio

import pytest
from mcp.types import (
    AudioContent,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.mcp.config import HttpServer, StdioServer, ToolOverride, parse_servers
from runtime.mcp.policy import derive
from runtime.mcp.results import looked_up, result_text
from runtime.mcp.tools import exposed_name

R, X, N = RecoveryPolicy.REPLAY, RecoveryPolicy.RECONNECT, RecoveryPolicy.INDETERMINATE
ALLOW, ASK, DENY = Permission.ALLOW, Permission.ASK, Permission.DENY


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        (None, (N, ASK, 1)),
        ({}, (N, ASK, 1)),  # destructiveHint defaults to true in the specification
        ({"read_only_hint": True}, (R, ALLOW, 3)),
        ({"idempotent_hint": True}, (R, ALLOW, 3)),
        ({"read_only_hint": True, "destructive_hint": True}, (R, ALLOW, 3)),
        ({"destructive_hint": True}, (N, ASK, 1)),
        ({"destructive_hint": True, "idempotent_hint": True}, (R, ALLOW, 3)),
        ({"destructive_hint": False}, (N, ALLOW, 1)),
        ({"open_world_hint": True}, (N, ASK, 1)),
    ],
)
def test_policy_from_annotations(hints, expected):
    annotations = None if hints is None else ToolAnnotations(**hints)
    pinned = derive(annotations)
    assert (pinned.policy, pinned.permission, pinned.max_attempts, pinned.lookup) == (
        *expected,
        None,
    )


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        (None, Effects.ONCE),
        ({}, Effects.ONCE),
        ({"read_only_hint": True}, Effects.NONE),
        ({"read_only_hint": True, "destructive_hint": True}, Effects.NONE),
        ({"idempotent_hint": True}, Effects.IDEMPOTENT),
        ({"destructive_hint": True, "idempotent_hint": True}, Effects.IDEMPOTENT),
        ({"destructive_hint": False}, Effects.ONCE),
    ],
)
def test_effects_from_annotations(hints, expected):
    """readOnlyHint: nothing outside changes; idempotentHint: repeats apply once (issue 22)."""
    assert derive(None if hints is None else ToolAnnotations(**hints)).effects is expected
    override = ToolOverride(effects=Effects.NONE)
    assert derive(None if hints is None else ToolAnnotations(**hints), override).effects is (
        Effects.NONE
    )


def test_effects_override_parses_from_json():
    (server,) = parse_servers(
        [{"name": "s", "command": "x", "tools": {"ping": {"effects": "none"}}}]
    )
    assert server.tools["ping"].effects is Effects.NONE
    with pytest.raises(ValueError, match="effects"):
        parse_servers([{"name": "s", "command": "x", "tools": {"ping": {"effects": "maybe"}}}])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (ToolOverride(permission=DENY), (R, DENY, 3, None)),
        (ToolOverride(max_attempts=5), (R, ALLOW, 5, None)),
        (ToolOverride(policy=N), (N, ALLOW, 1, None)),
        (ToolOverride(policy=X, lookup="find"), (X, ALLOW, 3, "find")),
        (ToolOverride(policy=X, lookup="find", max_attempts=2), (X, ALLOW, 2, "find")),
    ],
)
def test_overrides_win(override, expected):
    pinned = derive(ToolAnnotations(read_only_hint=True), override)
    assert (pinned.policy, pinned.permission, pinned.max_attempts, pinned.lookup) == expected


def test_reconnect_needs_a_lookup():
    with pytest.raises(ValueError, match="lookup"):
        ToolOverride(policy=X)


def _result(*content, structured=None, error=False) -> CallToolResult:
    return CallToolResult(content=list(content), structured_content=structured, is_error=error)


def test_result_text_keeps_every_block():
    text = result_text(
        _result(
            TextContent(type="text", text="hello"),
            ImageContent(type="image", data="aGVsbG8h", mime_type="image/png"),
            AudioContent(type="audio", data="aGk=", mime_type="audio/wav"),
            ResourceLink(type="resource_link", uri="file:///a.txt", name="a"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="file:///b.txt", text="inside"),
            ),
            structured={"n": 1},
        )
    )
    assert text.split("\n\n") == [
        "hello",
        "[image content: image/png, 6 bytes]",
        "[audio content: audio/wav, 2 bytes]",
        "[resource link: file:///a.txt (a)]",
        "[resource file:///b.txt]\ninside",
        '{"n": 1}',
    ]


def test_structured_content_is_not_repeated():
    result = _result(TextContent(type="text", text='{\n "n": 1\n}'), structured={"n": 1})
    assert result_text(result) == '{\n "n": 1\n}'
    assert result_text(_result()) == "(the tool returned no content)"


def test_lookup_answers():
    assert looked_up(_result(structured={"result": None})) is None
    assert looked_up(_result()) is None
    found = _result(TextContent(type="text", text='{"a": 1}'), structured={"result": {"a": 1}})
    assert '{"a": 1}' in looked_up(found)
    with pytest.raises(LookupError, match="down"):
        looked_up(_result(TextContent(type="text", text="down"), error=True))


def test_parse_servers():
    stdio, http = parse_servers(
        [
            {"name": "files", "command": "mcp-files", "args": ["--root", "/srv"]},
            {
                "name": "tickets",
                "url": "https://tickets.example/mcp",
                "headers_env": {"Authorization": "TICKETS_AUTH"},
                "tools": {"close": {"policy": "reconnect", "lookup": "find", "max_attempts": 2}},
            },
        ]
    )
    assert stdio == StdioServer(name="files", command="mcp-files", args=("--root", "/srv"))
    assert stdio.target == "mcp-files --root /srv"
    assert isinstance(http, HttpServer) and http.transport == "http"
    assert HttpServer(name="t", url="https://u:pw@h.example:8/mcp?x=1").target == (
        "https://h.example:8/mcp?x=1"
    )
    assert http.tools["close"] == ToolOverride(policy=X, lookup="find", max_attempts=2)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"name": "x"}, "(root)"),
        ([{"name": "bad name", "command": "x"}], "name"),
        ([{"name": "a", "url": "ftp://x"}], "url"),
        ([{"name": "a", "command": "x", "extra": 1}], "extra"),
        ([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}], "duplicate"),
        ([{"name": "a", "command": "x", "tools": {"t": {"policy": "reconnect"}}}], "lookup"),
        ([{"name": "a", "command": "x", "tools": {"t": {"policy": "sometimes"}}}], "policy"),
    ],
)
def test_parse_servers_refuses(data, problem):
    with pytest.raises(ValueError, match="MCP servers") as caught:
        parse_servers(data)
    assert problem in str(caught.value)


def test_missing_header_variable(monkeypatch):
    from runtime.errors import McpServerUnavailable

    server = HttpServer(name="t", url="http://127.0.0.1:1/mcp", headers_env={"X-T": "NO_SUCH_VAR"})
    monkeypatch.delenv("NO_SUCH_VAR", raising=False)
    with pytest.raises(McpServerUnavailable, match="NO_SUCH_VAR"):
        server.headers()
    monkeypatch.setenv("NO_SUCH_VAR", "v")
    assert server.headers() == {"X-T": "v"}


def test_exposed_names_are_safe_for_model_apis():
    assert exposed_name("files", "read") == "files__read"
    assert exposed_name("gh", "repos/get.file") == "gh__repos_get_file"
    assert len(exposed_name("s", "t" * 100)) == 64


def test_a_pinned_call_is_not_sent_to_a_server_whose_identity_changed():
    """The agent's server of that name now runs another command: the call's tool has no
    connection, so the attempt's outcome stays unknown and the pinned policy decides."""
    from runtime.domain.model import ToolCall
    from runtime.mcp.sessions import Connection, ConnectionLost
    from runtime.mcp.tools import pinned_tool
    from runtime.tools import ToolContext

    source = {"kind": "mcp", "server": "files", "tool": "read", "transport": "stdio"}
    call = ToolCall(
        call_id="c",
        index=0,
        tool_call_id="t",
        name="files__read",
        arguments={},
        arguments_text="{}",
        operation_id="op_1",
        policy=R,
        permission=ALLOW,
        max_attempts=3,
        source={**source, "target": "mcp-files --root /a", "input_schema": {"type": "object"}},
    )
    moved = Connection(StdioServer(name="files", command="mcp-files", args=("--root", "/b")))
    tool = pinned_tool(call, moved)
    assert (tool.policy, tool.max_attempts, tool.parameters) == (R, 3, {"type": "object"})
    ctx = ToolContext(run_id="r", call_id="c", operation_id="op_1", attempt=2, worker_id="w")
    with pytest.raises(ConnectionLost, match="no longer mcp-files --root /a"):
        asyncio.run(tool.arun(ctx, {}))
    with pytest.raises(ConnectionLost, match="no MCP server 'files' any more"):
        asyncio.run(pinned_tool(call, None).arun(ctx, {}))


def test_the_assistant_takes_its_servers_from_the_settings(settings):
    from runtime.demo.agent import assistant

    settings.RUNTIME_MCP_SERVERS = [{"name": "files", "command": "mcp-files"}]
    assert assistant().sources == (StdioServer(name="files", command="mcp-files"),)
    settings.RUNTIME_MCP_SERVERS = []
    assert assistant().sources == ()
