"""Fixtures of the console tests: users in each group, signed-in clients, and runs driven
into a given committed state through the coordinator (no worker needed).

Factories are fixtures that return functions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console.management.groups import ensure_groups
from runtime import operations
from tests.console.support import INPUT_SCHEMA, RunDriver


@pytest.fixture
def make_user(db) -> Callable[..., Any]:
    """make_user(name, group=None | "viewers" | "approvers" | "operators") -> User.

    The password is "pw-<name>".
    """
    groups = ensure_groups()

    def make(name: str, group: str | None = None):
        user = get_user_model().objects.create_user(username=name, password=f"pw-{name}")
        if group:
            user.groups.add(groups[group])
        return user

    return make


@pytest.fixture
def client_for(make_user) -> Callable[..., Client]:
    """client_for(group) -> a Client signed in as a new user of that group (None: no group)."""

    def make(group: str | None, name: str | None = None) -> Client:
        user = make_user(name or f"{group or 'nobody'}-{uuid.uuid4().hex[:6]}", group)
        client = Client()
        client.force_login(user)
        client.user = user  # type: ignore[attr-defined]
        return client

    return make


@pytest.fixture
def viewer(client_for) -> Client:
    return client_for("viewers", "vera")


@pytest.fixture
def approver(client_for) -> Client:
    return client_for("approvers", "abe")


@pytest.fixture
def operator(client_for) -> Client:
    return client_for("operators", "olga")


@pytest.fixture
def new_run(db) -> Callable[..., RunDriver]:
    """new_run(input="...", actor="starter") -> RunDriver of a new Running demo run."""

    def make(input: str = "Record invoice-42.", actor: str = "starter", **kwargs) -> RunDriver:
        return RunDriver(operations.start_run(agent="demo", input=input, actor=actor, **kwargs))

    return make


@pytest.fixture
def approval_run(new_run):
    """A run Awaiting an approval of ledger_approval; returns (driver, ticket_id)."""
    run = new_run()
    (call,) = run.open_batch(
        {"name": "ledger_approval", "arguments": {"key": "invoice-42"}, "permission": "ask"},
        text="Let me record that.",
    )
    return run, run.await_ticket(call, "approval", request={"tool": "ledger_approval"})


@pytest.fixture
def input_run(new_run):
    """A run Awaiting an input ticket with INPUT_SCHEMA; returns (driver, ticket_id)."""
    run = new_run()
    args = {"question": "Which account?", "answer_schema": INPUT_SCHEMA}
    (call,) = run.open_batch({"name": "ask_input", "arguments": args})
    return run, run.await_ticket(
        call, "input", request={"question": "Which account?"}, schema=INPUT_SCHEMA
    )


@pytest.fixture
def indeterminate_call(new_run):
    """A failed run whose ledger_once call was Executing: Indeterminate, effect may have started."""
    run = new_run()
    (call,) = run.open_batch({"name": "ledger_once", "arguments": {"key": "payment-7"}})
    run.execute(call, worker="worker-crashed")
    run.fail("the worker died during the call")
    return run, call
