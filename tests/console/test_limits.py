"""The console shows each limit's use (Workers page) and why a run waits (run page)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runtime.models import Run
from runtime.operations import start_run

pytestmark = pytest.mark.django_db


def test_the_workers_page_shows_limits_and_the_run_page_why_a_run_waits(viewer, settings):
    settings.RUNTIME_AGENTS = ["runtime.demo.agent.demo"]
    settings.RUNTIME_RUN_LIMITS = {"demo": {"runs": 1}}
    first = start_run(agent="demo", input="a")
    second = start_run(agent="demo", input="b")
    Run.objects.filter(id=first).update(
        lease_owner="w", lease_epoch=1, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    page = viewer.get(reverse("console:workers")).content.decode()
    assert 'data-limit="agent:demo"' in page and "<b>demo</b>" in page
    run_page = viewer.get(
        reverse("console:run", args=[second]) + "?part=holder", headers={"HX-Request": "true"}
    )
    assert "waiting for a slot: agent demo, 1 of 1 running" in run_page.content.decode()


def test_a_run_held_back_by_a_limit_is_not_said_to_wait_for_its_model(viewer, settings):
    """A new user saw both "waiting for a slot" and "Waiting for the model's answer" on the
    run page of a run that no model had been asked for yet."""
    settings.RUNTIME_AGENTS = ["runtime.demo.agent.demo"]
    settings.RUNTIME_RUN_LIMITS = {"demo": {"runs": 1}}
    first = start_run(agent="demo", input="a")
    second = start_run(agent="demo", input="b")
    Run.objects.filter(id=first).update(
        lease_owner="w", lease_epoch=1, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    page = viewer.get(reverse("console:run", args=[second])).content.decode()
    waiting_for = page.split('data-testid="waiting-for">', 1)[1].split("</dd>", 1)[0]
    # after the label "Waiting for", not "Waiting for waiting for"
    assert waiting_for.startswith("a slot: agent demo, 1 of 1 running"), waiting_for
