"""Which worker may drive which run during a deploy (issue 34, item 2): the pure rules."""

from __future__ import annotations

import pytest

from runtime.domain.versions import Routing, claimable, no_worker_reason

NEW = {"ops": "v2"}  # a worker of the new version


@pytest.mark.parametrize("routing", list(Routing))
def test_a_worker_drives_runs_of_its_own_version_and_runs_from_before_versions(routing):
    assert claimable("ops", "v2", NEW, {("ops", "v1")}, routing)
    assert claimable("ops", "", NEW, {("ops", "v1")}, routing)


@pytest.mark.parametrize("routing", list(Routing))
def test_a_worker_never_drives_an_agent_it_does_not_carry(routing):
    assert not claimable("billing", "v1", NEW, set(), routing)
    assert not claimable("billing", "", NEW, set(), routing)


def test_an_old_versions_run_goes_to_an_old_worker_while_one_is_live():
    live = {("ops", "v1"), ("ops", "v2")}
    assert not claimable("ops", "v1", NEW, live, Routing.DRAIN)
    assert not claimable("ops", "v1", NEW, live, Routing.PINNED)


def test_once_the_last_old_worker_is_gone_drain_hands_its_runs_to_the_new_ones():
    assert claimable("ops", "v1", NEW, {("ops", "v2")}, Routing.DRAIN)
    assert not claimable("ops", "v1", NEW, {("ops", "v2")}, Routing.PINNED)


def test_a_run_says_which_worker_it_waits_for():
    fleet = {("ops", "v2"), ("ops", "v3"), ("billing", "b1")}
    assert no_worker_reason("ops", "v1", fleet, Routing.PINNED) == (
        "waiting for a worker with version v1 of agent ops (live workers carry v2, v3;"
        " RUNTIME_AGENT_VERSION_ROUTING is pinned)"
    )
    assert no_worker_reason("ops", "v1", fleet, Routing.DRAIN) == ""
    assert no_worker_reason("ops", "v2", fleet, Routing.PINNED) == ""
    assert no_worker_reason("ops", "", fleet, Routing.PINNED) == ""
    for routing in Routing:
        assert no_worker_reason("crm", "c1", fleet, routing) == (
            "waiting for a worker that carries agent crm"
        )


def test_with_no_live_worker_at_all_the_holder_says_it_not_the_version():
    for routing in Routing:
        assert no_worker_reason("ops", "v1", set(), routing) == ""


@pytest.mark.parametrize("routing", list(Routing))
@pytest.mark.parametrize("version", ["", "v1", "v2", "v3"])
@pytest.mark.parametrize("agent", ["ops", "crm"])
def test_a_run_some_live_worker_may_drive_has_no_reason_to_wait(agent, version, routing):
    """The two rules agree: a run waits with a reason exactly when no live worker may
    claim it (each live worker carrying one version of each of its agents)."""
    workers = [{"ops": "v1"}, {"ops": "v2", "billing": "b1"}]
    fleet = {pair for mine in workers for pair in mine.items()}
    someone = any(claimable(agent, version, mine, fleet, routing) for mine in workers)
    assert someone == (no_worker_reason(agent, version, fleet, routing) == "")
