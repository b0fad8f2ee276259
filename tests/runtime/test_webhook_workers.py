"""Webhook acceptance with real worker subprocesses and a real local HTTP receiver (issue 23):
a receiver that is down for a while gets every event once or more, in order per run, each
signed; a SIGKILLed delivering worker loses none; a receiver that never answers well never
delays a run."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from runtime import webhooks
from runtime.models import Run, WebhookDelivery
from runtime.operations import cancel
from tests.runtime.support import text_step, tool_step, wait_for
from tests.runtime.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ALL = ["ticket.opened", "run.ended", "call.indeterminate", "run.paused"]


@pytest.fixture(autouse=True)
def local_receivers(settings):
    """The receivers here are on 127.0.0.1: internal, so allowed by name (README "Webhooks")."""
    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]


TIMEOUT = 2.0  # RUNTIME_WEBHOOK_TIMEOUT_SECONDS of these workers
HOOK_ENV = {
    "RUNTIME_WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT),
    "RUNTIME_WEBHOOK_BACKOFF_SECONDS": "0.1",
    "RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS": "0.5",
    "RUNTIME_WEBHOOK_MAX_ATTEMPTS": "100",
    "RUNTIME_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
}
LEASE = TIMEOUT + 5  # conf.webhook_lease(): a killed worker's delivery is free after it


def events_of_cancelled_runs(start, work_inline, n: int) -> dict[str, list[str]]:
    """n runs that each open an approval ticket and are cancelled: three events per run in
    two commits (ticket.opened; call.indeterminate and run.ended). Returns each run's message
    ids in commit order."""
    run_ids = [
        start(tool_step(("ledger_approval", {"key": f"k{i}"})), text_step()) for i in range(n)
    ]
    work_inline()
    for run_id in run_ids:
        cancel(run_id, reason="test")
    order: dict[str, list[str]] = {}
    for row in WebhookDelivery.objects.order_by("run_id", "seq", "idx"):
        order.setdefault(str(row.run_id), []).append(row.message_id)
    assert all(len(ids) == 3 for ids in order.values()) and len(order) == n
    return order


def assert_all_in_order(receiver: Receiver, order: dict[str, list[str]]) -> None:
    got = receiver.got
    assert all(r.verified for r in got), "every request carries a valid signature"
    for run_id, ids in order.items():
        firsts = list(
            dict.fromkeys(r.message_id for r in got if r.payload["data"]["run_id"] == run_id)
        )
        assert firsts == ids, f"run {run_id}: first receipts out of commit order"


def all_delivered() -> bool:
    return not WebhookDelivery.objects.exclude(state="delivered").exists()


def test_a_receiver_down_for_a_while_gets_every_event_in_order(start, work_inline, spawn_worker):
    receiver = Receiver(secret="")
    endpoint = webhooks.create_endpoint(url=receiver.url, events=ALL)
    receiver.secret = endpoint.secret
    order = events_of_cancelled_runs(start, work_inline, 4)
    worker = spawn_worker(until_idle=False, **HOOK_ENV)
    try:
        # Down until every run's first event was refused at least three times (the down
        # period follows the backoff setting, not a wall-clock constant).
        wait_for(
            lambda: WebhookDelivery.objects.filter(attempts__gte=3).count() == len(order),
            timeout=60,
            what="three refused attempts of each run's first event",
        )
        assert receiver.got == []
        # a run's later events wait for its first one
        assert (
            not WebhookDelivery.objects.filter(attempts__gt=0)
            .exclude(kind="ticket.opened")
            .exists()
        )
        receiver.start()
        wait_for(all_delivered, timeout=60, what="every event delivered")
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        receiver.stop()
    assert set(receiver.ids()) == {i for ids in order.values() for i in ids}
    assert_all_in_order(receiver, order)


def test_a_sigkilled_delivering_worker_loses_no_event(start, work_inline, spawn_worker):
    receiver = Receiver(secret="", hold=threading.Event())
    endpoint = webhooks.create_endpoint(url=receiver.url, events=ALL)
    receiver.secret = endpoint.secret
    receiver.start()
    order = events_of_cancelled_runs(start, work_inline, 3)
    first = spawn_worker(until_idle=False, worker_id="first", **HOOK_ENV)
    try:
        # Killed with requests in flight: the receiver holds them, unanswered.
        wait_for(lambda: receiver.holding >= 1, timeout=60, what="a delivery in flight")
        first.signal(signal.SIGKILL)
        first.wait()
        assert WebhookDelivery.objects.filter(state="delivered").count() == 0
        receiver.hold.set()  # answer 200 from now on
        receiver.hold = None
        second = spawn_worker(until_idle=False, worker_id="second", **HOOK_ENV)
        try:
            wait_for(all_delivered, timeout=LEASE + 60, what="every event delivered")
        finally:
            second.signal(signal.SIGTERM)
            second.wait()
    finally:
        receiver.stop()
    assert set(receiver.ids()) == {i for ids in order.values() for i in ids}
    assert_all_in_order(receiver, order)
    workers = set(
        WebhookDelivery.objects.filter(state="delivered").values_list(
            "attempt_log__worker", flat=True
        )
    )
    assert workers == {"second"}


def ended_natural(run_ids: list[str]) -> bool:
    return Run.objects.filter(id__in=run_ids, end_cause="natural").count() == len(run_ids)


def test_a_receiver_that_fails_forever_never_delays_a_run(start, spawn_worker):
    """Every request is held unanswered until all runs ended, then answered 500, forever: the
    runs end while deliveries are stuck in flight, and the worker exits idle meanwhile."""
    hold = threading.Event()
    receiver = Receiver(secret="", status=500, hold=hold)
    endpoint = webhooks.create_endpoint(url=receiver.url, events=ALL)
    receiver.secret = endpoint.secret
    receiver.start()
    steps: list[dict[str, Any]] = [tool_step(("slow", {"seconds": 0.2})), text_step()]
    run_ids = [start(*steps) for _ in range(6)]
    held_for = 120  # longer than the whole test: a held request is never answered in time
    env = {**HOOK_ENV, "RUNTIME_WEBHOOK_TIMEOUT_SECONDS": str(held_for)}
    try:
        worker = spawn_worker(until_idle=True, max_inflight=1, **env)  # one run at a time
        wait_for(lambda: receiver.holding >= 1, timeout=60, what="the first run's event held")
        assert not ended_natural(run_ids)  # runs still to go while a request hangs
        code, err = worker.wait(120)  # --until-idle: exits once no run is Running
        assert code == 0, err
        assert ended_natural(run_ids)
        assert (
            receiver.holding >= 1 and not WebhookDelivery.objects.filter(state="delivered").exists()
        )
        hold.set()  # from now on: 500 at once, forever
        receiver.hold = None
        retrying = spawn_worker(until_idle=False, **HOOK_ENV)
        try:
            # The requests the first worker left hanging are claimable once their leases
            # lapse (conf.webhook_lease: the timeout + 5 s); the others at once.
            wait_for(
                lambda: WebhookDelivery.objects.filter(attempts__gte=3).exists(),
                timeout=held_for + 5 + 60,
                what="deliveries retried",
            )
        finally:
            retrying.signal(signal.SIGTERM)
            retrying.wait()
    finally:
        receiver.stop()
    assert not WebhookDelivery.objects.filter(state="delivered").exists()
    assert all(r.verified for r in receiver.got)
