"""The Reconcile queue holds only what a person must check (issue 22, item 2).

A tool declares whether it has an external effect (``effects``, pinned into each call). A call
of a tool without one that a cancel seals is recorded as "no external effect; nothing to
check": it enters neither the queue, nor the run's needs-reconciliation flag, nor
``runtime_prune``'s keep rule. A call whose effect may have started (a real crash of
``ledger_once`` after its effect) is still Indeterminate, with its reason in words.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from console.management.groups import ensure_groups
from runtime import fsck, operations
from runtime.agents import get_agent
from runtime.domain.model import Effects, RecoveryPolicy
from runtime.inventory import unreconciled_calls
from runtime.models import Run, Thread, ToolCallRecord
from runtime.tools import ToolContext, tool
from tests.runtime.support import text_step, tool_step

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WAITS = 180
CRASHES = 4


def _operator() -> Client:
    user = get_user_model().objects.create_user(username="olga", password="pw-olga")
    user.groups.add(ensure_groups()["operators"])
    client = Client()
    client.force_login(user)
    return client


def _prune(days: str) -> dict:
    out = StringIO()
    call_command("runtime_prune", "--ended-before", days, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_180_cancelled_waits_and_4_crashes_leave_exactly_the_4_to_check(
    start, work_inline, crashers, worker
):
    # 180 runs that wait on the `wait` tool (a timer ticket, the call Executing -> Awaiting),
    # driven by the real worker loop in this process, then cancelled.
    waits = [start(tool_step(("wait", {"seconds": 600})), text_step()) for _ in range(WAITS)]
    work_inline(limit=WAITS + 20)
    assert Run.objects.filter(id__in=waits, state="awaiting").count() == WAITS
    for run_id in waits:
        operations.cancel(run_id, actor="olga", reason="not needed")

    # 4 real crashes of ledger_once after its effect applied; a second worker recovers them.
    dying = crashers(CRASHES, "effect_applied")
    crashed = [
        start(tool_step(("ledger_once", {"key": f"pay-{i}"})), text_step()) for i in range(CRASHES)
    ]
    for process in dying:
        code, err = process.wait(120)
        assert code == 137, err
    code, err = worker(worker_id="recoverer", timeout=120)
    assert code == 0, err

    sealed = ToolCallRecord.objects.filter(run_id__in=waits)
    assert sealed.count() == WAITS
    assert set(sealed.values_list("effects", "phase", "effect_may_have_started")) == {
        ("none", "indeterminate", False)
    }
    sample = sealed.first()
    assert sample is not None and sample.result is not None
    assert sample.result.startswith("No external effect; nothing to check")
    assert "cancelled" in sample.result

    to_check = list(unreconciled_calls().order_by("run_id"))
    assert sorted(c.run_id for c in to_check) == sorted(crashed)
    assert {(c.name, c.effects) for c in to_check} == {("ledger_once", "once")}
    assert all("may have taken effect" in (c.result or "") for c in to_check)

    # The console: the queue, its count and the runs list's flag say 4, not 184.
    client = _operator()
    page = client.get(reverse("console:reconcile"))
    assert page.context["pending_count"] == CRASHES
    assert sorted(card.call.run_id for card in page.context["cards"]) == sorted(crashed)
    runs = client.get(reverse("console:runs"), {"unreconciled": "on"})
    assert sorted(r.id for r in runs.context["runs"]) == sorted(crashed)
    assert runs.context["counts"]["unreconciled"] == CRASHES

    for run_id in (waits[0], waits[-1], *crashed):
        assert fsck.check_thread(Run.objects.get(id=run_id).thread_id) == []

    # Prune: nothing is old enough a day ahead; then the 180 go and the 4 are kept.
    assert _prune("1")["pruned"]["threads"] == 0
    report = _prune("0")
    crashed_threads = sorted(Run.objects.filter(id__in=crashed).values_list("thread_id", flat=True))
    assert report["pruned"]["threads"] == WAITS
    assert report["kept"] == [
        {"thread_id": tid, "reasons": ["unreconciled_indeterminate"]} for tid in crashed_threads
    ]
    assert not Run.objects.filter(id__in=waits).exists()
    assert Thread.objects.count() == CRASHES


def _noop(ctx: ToolContext) -> str:
    return ""


def test_tools_declare_effects_and_calls_pin_them():
    demo = get_agent("demo")
    declared = {t.name: t.effects.value for t in demo.tools}
    assert declared == {
        "ledger_replay": "idempotent",
        "ledger_reconnect": "once",
        "ledger_once": "once",
        "ledger_approval": "once",
        "ask_input": "none",
        "slow": "none",
        "wait": "none",
        "delegate": "idempotent",
    }

    # Undeclared: never "none"; the policy decides between idempotent and once.
    assert tool(policy=RecoveryPolicy.REPLAY)(_noop).effects is Effects.IDEMPOTENT
    assert tool(policy=RecoveryPolicy.INDETERMINATE)(_noop).effects is Effects.ONCE
    assert tool(policy=RecoveryPolicy.REPLAY, effects="none")(_noop).effects is Effects.NONE
    with pytest.raises(ValueError):
        tool(policy=RecoveryPolicy.REPLAY, effects="sometimes")(_noop)
