"""Hostile model output ends like NaN does: a typed tool error the model sees, never poison.

The scripted provider writes each hostile argument text verbatim as a tool call's arguments;
a real worker (claim, lease, loop) drives the run. The call must complete with an error
result naming the reason, the next inference must see it, the run must end naturally, and
no tool must run (the ledger stays empty).
"""

from __future__ import annotations

import pytest
from django.test import Client

from runtime.demo.models import LedgerEffect
from runtime.documents import run_document
from runtime.providers.base import InferenceResult, ToolCallOut
from tests.hostile.corpus import ARGUMENT_TEXTS, TEXT
from tests.hostile.test_surfaces import assert_inert

pytestmark = pytest.mark.django_db(transaction=True)

REASONS = {
    "nul": "NUL",
    "lone_surrogate": "surrogate",
    "deep": "deeper",
    "huge_int": "digits",
    "huge_float": "out of range",
    "nul_key": "NUL",
}


@pytest.mark.parametrize("name", sorted(ARGUMENT_TEXTS))
@pytest.mark.parametrize("tool", ["ledger_once", "ask_input"])
def test_hostile_arguments_are_a_tool_error(start, work_inline, name, tool) -> None:
    text = ARGUMENT_TEXTS[name]
    if tool == "ask_input":  # the question itself carries the hostile value
        text = text.replace('"key"', '"answer_schema": {"type": "object"}, "question"', 1)
    run_id = start({"tool_calls": [{"name": tool, "arguments": text}]}, {"text": "done"})
    work_inline()
    document = run_document(run_id)
    assert (document["state"], document["end_cause"]) == ("ended", "natural"), document
    [call] = document["batches"][0]["calls"]
    assert call["phase"] == "completed" and call["is_error"], call
    assert REASONS[name] in call["result"], call["result"]
    tool_messages = [m for m in document["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [call["result"]]
    assert LedgerEffect.objects.count() == 0


def test_unstorable_model_text_is_escaped_not_refused() -> None:
    """Text outside the arguments (answer, names, ids) is kept, with NUL and lone
    surrogates written as escapes, so any provider's result can be committed."""
    out = InferenceResult(
        text="a\x00b\ud800",
        tool_calls=(ToolCallOut(id="c\x00", name="n\ud800", arguments='{"k": "\x00"}'),),
    )
    assert out.text == "a\\u0000b\\ud800"
    [call] = out.tool_calls
    assert (call.id, call.name, call.arguments) == ("c\\u0000", "n\\ud800", '{"k": "\\u0000"}')


def test_hostile_model_output_renders_inert(start, work_inline, make_user) -> None:
    """What the model wrote (HTML, script, hostile arguments) is text on every page."""
    html = TEXT["html"]
    hostile = ARGUMENT_TEXTS["nul"].replace("a\\u0000b", html.replace('"', '\\"'))
    run_id = start(
        {"text": html, "tool_calls": [{"name": "ledger_approval", "arguments": hostile}]},
        {"tool_calls": [{"name": html, "arguments": ARGUMENT_TEXTS["lone_surrogate"]}]},
    )
    work_inline()
    user, _ = make_user("olga", superuser=True)
    client = Client()
    client.force_login(user)
    for path in (f"/runs/{run_id}/", "/inbox/", "/", "/reconcile/?show=all"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert_inert(response.content.decode())
